"""The build cell: where an image's steps run, never as the host's root (SPEC §12).

Like a sandbox cell, a build cell is a process chain with no Python in between:

    sh (join the build's cgroup: CPU, memory and pids limited)
      -> unshare --mount (a private stage of the binds below, as root, gone with the cell)
      -> setpriv (the unprivileged build uid, no_new_privs)
      -> bwrap (user namespace in which the build uid is root, pid/ipc/uts/cgroup
                namespaces, seccomp) -> the step

It differs from a sandbox cell where building needs it to: the network namespace is the
host's (egress open, for package downloads), the uid inside is 0, and the root being built
is writable. A step's output is streamed line by line; its failure carries the last lines.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.cellapi.environment import FIXED_PATH
from sandcell.isolation import cgroups, seccomp
from sandcell.isolation.bwrap import SYSTEM_LINKS, Bind, host_system
from sandcell.isolation.images import stage
from sandcell.isolation.runtime import CELL_SRC, cell_python, runtime_mounts

STAGE = "/run/sandcell-build-stage"
# One uid for every build: outside the cells' range, and every build cell has its own pid
# namespace and mount view, so two builds cannot see or signal each other.
BUILD_UID = 199_999
BUILD_LIMITS = cgroups.Limits(memory_mb=2048, pids_max=2048, cpus=1.0)
STEP_TIMEOUT_S = 1800.0
ID_RANGE = 65536
TAIL_LINES = 20
# Downloads in build steps trust the host's CAs (a site's TLS-inspecting proxy included),
# not only the image's own: the image may have none yet.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BUILD_CA_BUNDLE = "/.sandcell/ca-certificates.crt"
BUILD_ENV = {"PATH": FIXED_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}  # noqa: S108
CA_ENV = {"PIP_CERT": BUILD_CA_BUNDLE, "SSL_CERT_FILE": BUILD_CA_BUNDLE}


class StepFailed(Exception):
    def __init__(self, message: str, tail: list[str]) -> None:
        super().__init__(message)
        self.tail = tail


@dataclass(frozen=True)
class Step:
    """One command in a build cell. `image_root`: the root being built, mounted writable as
    / with the daemon's runtime staged beside it; None: the host's system dirs, read-only.
    `userns_base`: instead of bwrap, a user namespace mapping ID_RANGE ids from this host
    uid (for mmdebstrap, which needs many uids and chroot)."""

    command: list[str]
    binds: list[Bind] = field(default_factory=list)
    image_root: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    chdir: str = "/"
    userns_base: int | None = None


class BuildCells:
    def __init__(self, cgroup_parent: str, scratch: Path) -> None:
        self.privileged = os.geteuid() == 0
        self.scratch = scratch
        self.cgroup_parent = cgroup_parent

    def run(self, step: Step, on_line: Callable[[str], None]) -> None:
        """Runs the step to completion; raises StepFailed with the log's tail otherwise."""
        name = f"build-{secrets.token_hex(6)}"
        cgroup = self._cgroup(name)
        work = self.scratch / name
        work.mkdir(mode=0o755)
        seccomp_fd = None
        try:
            if step.userns_base is not None:  # mmdebstrap: unshare and mount are its job
                if not self.privileged:
                    raise StepFailed("mapping a range of ids needs the server to run as root", [])
                binds, argv, uid = step.binds, _mapped_argv(step), step.userns_base
            else:
                seccomp_fd = _memfd(seccomp.build_filter())
                binds, argv = self._bwrap(step, work, seccomp_fd)
                uid = BUILD_UID
            script = self._script(cgroup, binds, argv, uid, no_new_privs=uid == BUILD_UID)
            failure = self._stream(script, seccomp_fd, on_line, step.userns_base, cgroup)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            if cgroup is not None:
                cgroup.destroy()
            if step.image_root is not None:
                _unstage(step.image_root)
            _remove_tree(work)
        if failure is not None:
            raise StepFailed(*failure)

    def _cgroup(self, name: str) -> cgroups.CellCgroup | None:
        try:
            return cgroups.detect(self.cgroup_parent).create(name, BUILD_LIMITS)
        except cgroups.CgroupUnavailable:
            if self.privileged:
                raise
            return None  # an unprivileged development run: no cgroup to join

    def _bwrap(self, step: Step, work: Path, seccomp_fd: int) -> tuple[list[Bind], list[str]]:
        """The binds to stage and bwrap's argv, with each bind's source as `{0}`, `{1}`..."""
        env = BUILD_ENV
        if step.image_root is None:
            system = host_system({p: os.readlink(p) for p in SYSTEM_LINKS if os.path.islink(p)})
            binds = [Bind(m.host, m.cell) for m in runtime_mounts()]
            python, chdir = [cell_python()], CELL_SRC
        else:
            staged = stage.stage_runtime(work)
            system = ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
            system += ["--ro-bind-try", HOST_CA_BUNDLE, BUILD_CA_BUNDLE]
            binds = [Bind(str(step.image_root), "/", writable=True), *staged.binds]
            python, chdir = staged.python, step.chdir
            env = {**env, **CA_ENV}
        command = [*python, *step.command[1:]] if step.command[0] == "python" else step.command
        argv = ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup"]
        argv += ["--hostname", "sandcell-build", "--die-with-parent", "--new-session"]
        argv += ["--clearenv", *_setenv({**env, **step.env})]
        binds += step.binds
        placed = [
            arg
            for i, bind in enumerate(binds)
            for arg in ("--bind" if bind.writable else "--ro-bind", f"{{{i}}}", bind.dest)
        ]
        argv += [*placed[:3], *system, "--proc", "/proc", "--dev", "/dev"]
        argv += ["--tmpfs", "/tmp", *placed[3:]]  # noqa: S108
        argv += ["--seccomp", str(seccomp_fd), "--chdir", chdir, "--", *command]
        return binds, argv

    def _script(
        self,
        cgroup: cgroups.CellCgroup | None,
        binds: list[Bind],
        argv: list[str],
        uid: int,
        *,
        no_new_privs: bool,
    ) -> str:
        """The launch chain; `uid` is the host uid the step starts as. Its bounding set stays
        whole, and a mapped step runs without no_new_privs: uid 0 of its own namespace must
        gain that namespace's capabilities at exec (setuid files of host-owned uids unmapped
        in there are not honoured by the kernel; nothing else could raise it)."""
        q = shlex.quote
        lines = _join_cgroup(cgroup)
        if not self.privileged:
            return "\n".join([*lines, "exec " + shlex.join(_fill(argv, binds, None))])
        # That uid may not reach the binds' sources (a data dir under /root): root binds
        # them onto a private stage first, as for sandbox cells.
        inner = [f"mount -t tmpfs -o mode=0755,size=64k sandcell-build {STAGE}"]
        for index, bind in enumerate(binds):
            target = f"{STAGE}/{index}"
            make = "mkdir" if os.path.isdir(bind.source) else "touch"
            inner.append(f"{make} {q(target)} && mount --bind {q(bind.source)} {q(target)}")
        setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        setpriv += ["--no-new-privs"] if no_new_privs else []
        inner.append("exec " + shlex.join([*setpriv, "--", *_fill(argv, binds, STAGE)]))
        script = "set -eu\n" + "\n".join(inner)
        lines.append(f"exec unshare --mount --propagation private -- /bin/sh -c {q(script)}")
        return "\n".join(lines)

    def _stream(
        self,
        script: str,
        seccomp_fd: int | None,
        on_line: Callable[[str], None],
        userns_base: int | None,
        cgroup: cgroups.CellCgroup | None,
    ) -> tuple[str, list[str]] | None:
        """None on success, else (message, last lines). A step past STEP_TIMEOUT_S, or one
        whose start fails, is killed whole (its cgroup), so its output pipe closes."""
        Path(STAGE).mkdir(mode=0o755, exist_ok=True)
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL if userns_base is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            start_new_session=True,
            env={"PATH": FIXED_PATH},
            cwd="/",
        )

        def kill() -> None:
            if cgroup is not None:
                cgroup.kill_all()
            proc.kill()

        expired = threading.Event()

        def expire() -> None:
            expired.set()
            kill()

        timer = threading.Timer(STEP_TIMEOUT_S, expire)
        timer.start()
        assert proc.stdout is not None
        try:
            with proc:
                if userns_base is not None:
                    _map_ids(proc, userns_base)
                for raw in proc.stdout:
                    tail.append(raw.decode(errors="replace").rstrip("\n"))
                    on_line(tail[-1])
        except BaseException:
            kill()
            raise
        finally:
            timer.cancel()
        if expired.is_set():
            return f"timed out after {STEP_TIMEOUT_S:.0f} s", list(tail)
        if proc.returncode != 0:
            return f"exited with status {proc.returncode}", list(tail)
        return None


def _join_cgroup(cgroup: cgroups.CellCgroup | None) -> list[str]:
    q = shlex.quote
    procs_files = cgroup.procs_files if cgroup is not None else []
    return ["set -eu", *(f"echo $$ > {q(p)}" for p in procs_files), "ulimit -c 0"]


def _mapped_argv(step: Step) -> list[str]:
    """A new user namespace whose ids 0-65535 are host ids from `userns_base` (the uid the
    chain drops to). unshare cannot map a range without newuidmap and /etc/subuid, so the
    launcher (root, outside) writes the maps itself (`_map_ids`) while the inner shell
    waits on stdin; its next exec, as uid 0 in there, holds that namespace's capabilities
    and nothing on the host. `{i}` in the command stands for the step's i-th bind."""
    env = ["env", "-i", *(f"{k}={v}" for k, v in {**BUILD_ENV, **step.env}.items())]
    inner = f"read go\nexec {shlex.join([*env, *step.command])}"
    return [
        "unshare",
        "--user",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--",
        "sh",
        "-c",
        inner,
    ]


def _map_ids(proc: subprocess.Popen[bytes], base: int) -> None:
    """Once the launcher has entered its user namespace: its uid and gid maps, then go."""
    own = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{proc.pid}/ns/user") == own:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise StepFailed("the build's user namespace did not start", [])
        time.sleep(0.005)
    for name in ("uid_map", "gid_map"):
        Path(f"/proc/{proc.pid}/{name}").write_text(f"0 {base} {ID_RANGE}\n")
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()


def _fill(argv: list[str], binds: list[Bind], staged: str | None) -> list[str]:
    """`{i}` in the arguments replaced by the i-th bind's source, or its place on the stage."""
    filled = []
    for arg in argv:
        for i, bind in enumerate(binds):
            arg = arg.replace(f"{{{i}}}", f"{staged}/{i}" if staged else bind.source)
        filled.append(arg)
    return filled


def _setenv(env: dict[str, str]) -> list[str]:
    args: list[str] = []
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args


def _unstage(root: Path) -> None:
    """The mount points bwrap made in the root for the runtime are not part of the image."""
    _remove_tree(root / stage.RUNTIME_DIR.lstrip("/"))


def _remove_tree(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("sandcell-build-seccomp")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
