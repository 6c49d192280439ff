"""Starting a cell's launcher, and killing it: the one process the manager holds of a cell.

The launcher is a shell script. As root it runs in four steps, each one process image, no
Python in between:

    sh (join the cell's cgroups, set rlimits, protect the tree from the OOM killer)
      -> unshare --mount (a private mount namespace: the stage dies with the cell)
      -> setpriv (drop to the cell's unprivileged host uid, no_new_privs)
      -> bwrap (user/pid/mount/ipc/uts/cgroup/net namespaces, seccomp) -> python daemon

The private namespace first gets the stage (isolation/staging.py), which keeps every host path
out of the cell's mount table.

What the cell gets from the host it gets as file descriptors, so that nothing of the host is
named inside it and nothing the host relies on is the cell's to change: the daemon's listening
socket (bound here, owned by the manager, in a directory only the manager can enter) and the
seccomp program (and, unprivileged, the generated /etc files).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.cellapi.argv import daemon_args
from sandcell.cellapi.environment import FIXED_PATH
from sandcell.isolation import cgroups, landlock, seccomp, staging
from sandcell.isolation.bwrap import CELL_WORKSPACE, build_argv, bwrap_made
from sandcell.isolation.images.stage import StageError
from sandcell.isolation.policy import CellPolicy

# The root launcher lowers its own score, which also sets the floor (oom_score_adj_min) that
# no unprivileged descendant can go below. Every process of the cell starts from it; the
# daemon then raises each command to 1000 (daemon/spawn.py), so the OOM killer takes
# commands first and the daemon last. Lowering needs CAP_SYS_RESOURCE, which root lacks in
# some containers: the daemon then keeps the host's default (0), still far below 1000.
DAEMON_OOM_SCORE_ADJ = -500
_CAP_SYS_RESOURCE = 24


class CellError(Exception):
    """A cell could not be started or reached."""


def start(
    cell_dir: Path,
    uid: int,
    policy: CellPolicy,
    identity: tuple[str, bytes],
    cgroup: cgroups.CellCgroup | None,
    listener: socket.socket,
    *,
    privileged: bool,
) -> subprocess.Popen[bytes]:
    """Starts the launcher of the cell in `cell_dir`, running as host `uid` (as root; else
    as its caller); `identity` is the sandbox id and the bootstrap public key. The layers the
    policy requires and the host lacks raise IsolationUnavailable here, before anything
    runs."""
    use_seccomp = policy.require("seccomp", True, "")
    use_landlock = policy.require("landlock", *landlock.cell_support())
    try:
        root = staging.CellRoot.of(cell_dir, policy)
    except StageError as exc:
        raise CellError(str(exc)) from None
    stage_lines, binds, image_root = staging.cell_binds(cell_dir, root, staged=privileged)
    scratch = staging.scratch_sizes(policy)
    with contextlib.ExitStack() as fds:
        passed = [listener.fileno()]
        proc = staging.proc_files()
        if privileged:
            own_lines, own = staging.own_filesystems(uid, root.etc_files(), scratch, proc)
            stage_lines += own_lines
        else:
            etc = {
                f"/etc/{name}": _memfd(fds, f"sandcell-etc-{name}", content.encode())
                for name, content in root.etc_files().items()
            }
            over_proc = {
                f"/proc/{path}": _memfd(fds, "sandcell-proc", content.encode())
                for path, content in proc.items()
            }
            passed += [*etc.values(), *over_proc.values()]
            own = bwrap_made(etc, scratch, over_proc)
        seccomp_fd = None
        if use_seccomp:
            seccomp_fd = _memfd(fds, "sandcell-seccomp", seccomp.build_filter())
            passed.append(seccomp_fd)
        argv = build_argv(
            own=own,
            binds=binds,
            system=root.system(image_root),
            env={**dict(policy.image_env), **_daemon_env(*identity)},
            seccomp_fd=seccomp_fd,
            command=[*root.python, *_daemon_args(policy, listener.fileno(), use_landlock)],
            chdir=root.chdir,
        )
        launcher = script(
            cgroup_procs=cgroup.procs_files if cgroup else [],
            rlimits=Rlimits(policy.nofile, policy.disk_mb),
            bwrap_argv=argv,
            root=(uid, stage_lines) if privileged else None,
        )
        return _popen(cell_dir / "cell.log", launcher, passed)


@contextlib.contextmanager
def listen(path: str) -> Iterator[socket.socket]:
    """The daemon's listening socket, bound here: the file is the manager's (0600 in a 0700
    directory), so a cell can neither chmod it nor replace it; the daemon gets the fd."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(path)
        except OSError as exc:  # a cells directory too deep for a unix socket path, say
            raise CellError(f"cannot bind the daemon's socket {path}: {exc}") from exc
        os.chmod(path, 0o600)
        sock.listen(1024)
        yield sock
    finally:
        sock.close()  # the daemon holds its own copy


def _daemon_env(sandbox_id: str, pem: bytes) -> dict[str, str]:
    return {
        "PATH": FIXED_PATH,
        "HOME": CELL_WORKSPACE,
        "LANG": "C.UTF-8",
        "SANDCELL_SANDBOX_ID": sandbox_id,
        "SANDCELL_WORKSPACE": CELL_WORKSPACE,
        "SANDCELL_BOOTSTRAP_PUBLIC_KEY": pem.decode(),
    }


def _daemon_args(policy: CellPolicy, listen_fd: int, use_landlock: bool) -> list[str]:
    """What follows the interpreter: `-m sandcell.daemon` and its arguments."""
    args = daemon_args(
        fd=listen_fd,
        disk_quota_mb=policy.disk_mb,
        inherit_env=policy.inherit_env,
        landlock=use_landlock,
        deny_tcp=policy.network == "none",
        code_python=policy.code_python,
        in_cell=True,
    )
    return ["-s", "-B", "-m", "sandcell.daemon", *args]


def may_lower_oom_score() -> bool:
    """Whether this process (and so the launcher it starts) has CAP_SYS_RESOURCE."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << _CAP_SYS_RESOURCE))
    return False


@dataclass(frozen=True)
class Rlimits:
    nofile: int
    fsize_mb: int


def script(
    *,
    cgroup_procs: Sequence[str],
    rlimits: Rlimits,
    bwrap_argv: Sequence[str],
    root: tuple[int, list[str]] | None,
) -> str:
    """The launcher; `root` is (the cell's host uid, the stage lines) when run as root,
    None for an unprivileged launch straight into bwrap (no stage, no uid change)."""
    q = shlex.quote
    lines = ["set -eu"]
    lines += [f"echo $$ > {q(procs)}" for procs in cgroup_procs]
    fsize_blocks = rlimits.fsize_mb * 2048  # dash counts ulimit -f in 512-byte blocks
    lines.append(f"ulimit -c 0; ulimit -n {rlimits.nofile}; ulimit -f {fsize_blocks}")
    bwrap = " ".join(q(a) for a in bwrap_argv)
    if root is None:
        lines.append(f"exec {bwrap}")
        return "\n".join(lines)
    uid, stage_lines = root
    if may_lower_oom_score():
        lines.append(f"echo {DAEMON_OOM_SCORE_ADJ} > /proc/self/oom_score_adj")
    inner = [
        *stage_lines,
        f"exec setpriv --reuid={uid} --regid={uid} --clear-groups"
        f" --no-new-privs --bounding-set=-all -- {bwrap}",
    ]
    lines.append(
        "exec unshare --mount --propagation private -- /bin/sh -c "
        + q("set -eu\n" + "\n".join(inner))
    )
    return "\n".join(lines)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """Kills a launched cell through its PID namespace: the launcher's execs end in bwrap's
    outer half, whose one child is the namespace's init, and when that init dies the kernel
    kills every process of the namespace, however it detached itself (setsid, a double
    fork, SIGTERM ignored). Killing bwrap alone would leave the init running, reparented to
    the host's. Stopped first, bwrap cannot start an init after its children were listed;
    as our unreaped child it also keeps its children's pids from being reused meanwhile.

    Without cgroups and without root this is the only kill switch (the launcher's uid is
    its caller's, shared), so it is what makes a degraded cell die with its deletion; bwrap's
    --die-with-parent is no substitute, since it would also kill the cell with whichever
    manager thread started it, and cells outlive manager restarts."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _popen(log_path: Path, script: str, fds: list[int]) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            ["/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=fds,
            start_new_session=True,
            env={"PATH": FIXED_PATH},
            cwd="/",
        )


def _memfd(fds: contextlib.ExitStack, name: str, data: bytes) -> int:
    """`data` in an anonymous file for bwrap to read; closed when `fds` unwinds."""
    fd = os.memfd_create(name)  # close-on-exec; pass_fds hands it to the launcher alone
    fds.callback(os.close, fd)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
