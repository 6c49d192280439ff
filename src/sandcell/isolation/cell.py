"""Local cells: a daemon and everything it runs, confined together (SPEC §3).

A cell is launched by a shell script (isolation/launch.py): as root, it drops to the cell's own
unprivileged host uid after staging the cell's mounts in a private mount namespace.

What the cell gets from the host it gets as file descriptors, so that nothing of the host is
named inside it and nothing the host relies on is the cell's to change: the daemon's listening
socket (bound here, owned by the manager, in a directory only the manager can enter), the
seccomp program and the generated /etc files.

Nothing of a cell outlives `destroy()`: its cgroup is killed and removed, the private mount
namespace goes with its last process, the workspace is unmounted and its directory deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from sandcell.cellapi import health
from sandcell.cellapi.argv import daemon_args
from sandcell.cellapi.client import transport_for
from sandcell.cellapi.environment import FIXED_PATH
from sandcell.isolation import cgroups, disk, landlock, launch, seccomp
from sandcell.isolation.bwrap import (
    CELL_UID,
    CELL_WORKSPACE,
    SYSTEM_LINKS,
    Bind,
    build_argv,
    host_system,
)
from sandcell.isolation.images import stage
from sandcell.isolation.policy import CellPolicy
from sandcell.isolation.runtime import CELL_SRC, cell_python, compile_package, runtime_mounts

UID_REGISTRY = Path("/run/sandcell-uids")
log = logging.getLogger("sandcell.isolation.cell")
DEFAULT_UID_BASE = 200_000
DEFAULT_UID_COUNT = 10_000
START_TIMEOUT_S = 20.0
# In a cell's dir: where its workspace goes when the cell is destroyed, instead of being deleted
# (a pause, SPEC §13). Written before the workspace moves in, so no crash can lose it.
WORKSPACE_HOME = "workspace.home"
_ID_ALPHABET = set("abcdefghijklmnopqrstuvwxyz0123456789-")


class CellError(Exception):
    """A cell could not be started or reached."""


@dataclass(frozen=True)
class CellInfo:
    """What survives a manager restart (meta.json in the cell's directory)."""

    cell_id: str
    uid: int
    uds: str
    cgroup: str | None
    workspace: str
    created_at: float


def _check_id(cell_id: str) -> str:
    if not cell_id or len(cell_id) > 64 or not set(cell_id) <= _ID_ALPHABET:
        raise ValueError(f"invalid cell id {cell_id!r}")
    return cell_id


def new_cell_id() -> str:
    return f"c{secrets.token_hex(8)}"


class LocalCells:
    """Creates, finds and destroys the cells under one directory on this host."""

    def __init__(
        self,
        cells_dir: Path,
        *,
        cgroup_parent: str = "sandcell",
        uid_base: int = DEFAULT_UID_BASE,
        uid_count: int = DEFAULT_UID_COUNT,
    ) -> None:
        self.cells_dir = Path(cells_dir)
        self.cells_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.privileged = os.geteuid() == 0
        self.uid_base, self.uid_count = uid_base, uid_count
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._destroying: dict[str, threading.Lock] = {}
        try:
            self.cgroups: cgroups.CgroupDriver | None = cgroups.detect(cgroup_parent)
            self._cgroup_problem = ""
        except cgroups.CgroupUnavailable as exc:
            self.cgroups, self._cgroup_problem = None, str(exc)
        if self.privileged:
            Path(launch.STAGE).mkdir(mode=0o755, parents=True, exist_ok=True)
        compile_package()

    # -- lifecycle -------------------------------------------------------------------------

    def create(
        self,
        cell_id: str,
        policy: CellPolicy,
        sandbox_id: str,
        bootstrap_public_pem: bytes,
        workspace: Path | None = None,
    ) -> CellInfo:
        """Starts a cell and waits until its daemon answers /health; cleans up on failure.

        `workspace`: a kept workspace (an image or a directory) to run on instead of a new
        one; it goes back where it was if the cell is destroyed, failed starts included."""
        if workspace is not None and not workspace.exists():
            raise CellError(f"the kept workspace {workspace} is gone")
        cell_dir = self.cells_dir / _check_id(cell_id)
        cell_dir.mkdir(mode=0o700)
        try:
            if workspace is not None:
                self.keep_workspace(cell_id, workspace)
            info = self._start(cell_dir, cell_id, policy, (sandbox_id, bootstrap_public_pem))
            self._wait_healthy(cell_id, Path(info.uds))
            return info
        except BaseException:
            self.destroy(cell_id)
            raise

    def keep_workspace(self, cell_id: str, home: Path) -> None:
        """From now on destroying the cell moves its workspace to `home` instead of deleting
        it. Atomic (a crash leaves the old marker or the new one); no-op for a gone cell."""
        cell_dir = self.cells_dir / _check_id(cell_id)
        if not cell_dir.is_dir():
            return
        partial = cell_dir / f"{WORKSPACE_HOME}.partial"
        partial.write_text(str(home))
        os.replace(partial, cell_dir / WORKSPACE_HOME)

    def destroy(self, cell_id: str) -> None:
        """Kills every process of the cell and removes all it had on the host. Idempotent,
        and safe to call concurrently (a user's delete racing the reaper)."""
        with self._lock:
            lock = self._destroying.setdefault(cell_id, threading.Lock())
        with lock:
            self._destroy(cell_id)
        with self._lock:
            self._destroying.pop(cell_id, None)

    def stop(self, cell_id: str) -> None:
        """Kills every process of the cell at once, without waiting for their exits or
        removing anything: `destroy` does the rest. A cell made without a cgroup has no
        fork-proof way to be killed quickly, so it is destroyed here."""
        info = self._read_info(self.cells_dir / _check_id(cell_id))
        cg = self.cgroups.open(info.cgroup) if info and info.cgroup and self.cgroups else None
        if cg is None:
            self.destroy(cell_id)
            return
        cg.kill()  # the launcher too: its first step puts itself in the cgroup

    def _destroy(self, cell_id: str) -> None:
        cell_dir = self.cells_dir / _check_id(cell_id)
        info = self._read_info(cell_dir)
        cgroup_name = info.cgroup if info else _cgroup_name(cell_id)
        # None: made without a cgroup (the layer degraded), nothing to remove there.
        cg = self.cgroups.open(cgroup_name) if cgroup_name and self.cgroups else None
        if cg is not None:
            cg.destroy()
        proc = self._procs.pop(cell_id, None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        disk.release_workspace(cell_dir / "workspace")
        _send_workspace_home(cell_dir)
        shutil.rmtree(cell_dir, ignore_errors=True)
        if info is not None and self.privileged:
            with contextlib.suppress(OSError):
                claim = UID_REGISTRY / str(info.uid)
                if claim.read_text() == str(cell_dir):
                    claim.unlink()

    def copy_workspace(self, cell_id: str, dest: Path) -> int:
        """A consistent copy of a live cell's workspace at `dest`: its processes are frozen
        and its filesystem synced while it is taken, then thawed. Returns its bytes."""
        cell_dir = self.cells_dir / _check_id(cell_id)
        info = self._read_info(cell_dir)
        if info is None:
            raise CellError(f"cell {cell_id} is gone")
        cg = self.cgroups.open(info.cgroup) if self.cgroups and info.cgroup else None
        image = cell_dir / "disk.img"
        with cg.frozen() if cg is not None else contextlib.nullcontext(False):
            disk.sync_filesystem(Path(info.workspace))
            return disk.copy_workspace(image if image.exists() else Path(info.workspace), dest)

    def workspace_bytes(self, cell_id: str) -> int:
        """What a copy of the live workspace would take, once what the cell wrote is
        flushed to its image (until then the image's blocks undercount it)."""
        cell_dir = self.cells_dir / _check_id(cell_id)
        image, workspace = cell_dir / "disk.img", cell_dir / "workspace"
        disk.sync_filesystem(workspace)
        return disk.allocated_bytes(image if image.exists() else workspace)

    def thaw(self, cell_id: str) -> None:
        """Undoes a freeze that a crash mid-snapshot left on the cell."""
        info = self._read_info(self.cells_dir / _check_id(cell_id))
        if info is not None and info.cgroup and self.cgroups:
            cg = self.cgroups.open(info.cgroup)
            if cg is not None:
                cg.thaw()

    def list(self) -> list[CellInfo]:
        infos = []
        for child in sorted(self.cells_dir.iterdir()):
            if (info := self._read_info(child)) is not None:
                infos.append(info)
        return infos

    def destroy_all(self) -> list[str]:
        """Destroys every cell under this directory, records or not; returns their ids
        (shutting a host down, cleaning up after tests and benchmarks)."""
        ids = [i.cell_id for i in self.list()] + self.leftovers()
        for cell_id in ids:
            self.destroy(cell_id)
        return ids

    def leftovers(self) -> list[str]:
        """Cell directories without a readable record (a crash mid-create): to destroy."""
        return [c.name for c in self.cells_dir.iterdir() if self._read_info(c) is None]

    def alive(self, info: CellInfo) -> bool:
        return health.probe_sync({"uds": info.uds})

    # -- internals -------------------------------------------------------------------------

    def _start(
        self, cell_dir: Path, cell_id: str, policy: CellPolicy, identity: tuple[str, bytes]
    ) -> CellInfo:
        """`identity` is the sandbox id and the bootstrap public key."""
        uid = self._allocate_uid(cell_dir) if self.privileged else os.geteuid()
        workspace, run_dir = cell_dir / "workspace", cell_dir / "run"
        quota = policy.require("disk_quota", *disk.loop_quota_available())
        kept = _kept_workspace(cell_dir)
        if kept is not None:
            # The kind it was made as: an image where quotas were on, else a directory.
            target = workspace if kept.is_dir() else cell_dir / "disk.img"
            os.rename(kept, target)
            disk.adopt_workspace(target, workspace, uid)
        elif quota:
            disk.create_quota_workspace(cell_dir / "disk.img", workspace, policy.disk_mb, uid)
        else:
            disk.create_plain_workspace(workspace, uid)
        run_dir.mkdir(mode=0o700)  # the manager's: the cell neither sees nor owns it
        cgroup = self._make_cgroup(cell_id, policy)
        info = CellInfo(
            cell_id,
            uid,
            str(run_dir / "daemon.sock"),
            cgroup.name if cgroup else None,
            str(workspace),
            time.time(),
        )
        (cell_dir / "meta.json").write_text(json.dumps(asdict(info)))
        with _listen(info.uds) as listener:
            self._spawn(cell_dir, info, policy, identity, cgroup, listener)
        return info

    def _allocate_uid(self, cell_dir: Path) -> int:
        """A host uid no other cell on this host holds, whichever sandcell made it: claims
        are files in a host-wide registry naming the claiming cell's directory; a claim
        whose directory is gone (a crash, a destroyed cell) is free again. A uid that some
        process still runs as is never handed out, claim or not: a cell whose directory was
        removed from under it may still run, and a new tenant must not share its uid."""
        UID_REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
        for uid in range(self.uid_base, self.uid_base + self.uid_count):
            claim = UID_REGISTRY / str(uid)
            for _ in range(2):
                try:
                    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    if not _stale_claim(claim):
                        break
                    claim.unlink(missing_ok=True)
                    continue
                with os.fdopen(fd, "w") as f:
                    f.write(str(cell_dir))
                if not _runs_as(uid):
                    return uid
                log.warning("cell uid %d skipped: processes still run as it, of no cell", uid)
                claim.unlink(missing_ok=True)
                break
        raise CellError("no free cell uid left in the configured range")

    def _make_cgroup(self, cell_id: str, policy: CellPolicy) -> cgroups.CellCgroup | None:
        if not policy.require("cgroups", self.cgroups is not None, self._cgroup_problem):
            return None
        assert self.cgroups is not None
        limits = cgroups.Limits(policy.memory_mb, policy.pids_max, policy.cpus)
        try:
            return self.cgroups.create(_cgroup_name(cell_id), limits)
        except cgroups.CgroupUnavailable as exc:
            policy.require("cgroups", False, str(exc))
            return None

    def _spawn(
        self,
        cell_dir: Path,
        info: CellInfo,
        policy: CellPolicy,
        identity: tuple[str, bytes],
        cgroup: cgroups.CellCgroup | None,
        listener: socket.socket,
    ) -> None:
        """Starts the launcher; `identity` is the sandbox id and the bootstrap public key."""
        use_seccomp = policy.require("seccomp", True, "")
        use_landlock = policy.require("landlock", *landlock.cell_support())
        root = _Root.of(cell_dir, policy)
        stage_lines, binds, image_root = self._binds(cell_dir, root)
        with contextlib.ExitStack() as fds:
            etc = {
                f"/etc/{name}": _memfd(fds, f"sandcell-etc-{name}", content.encode())
                for name, content in ETC_FILES.items()
            }
            passed = [listener.fileno(), *etc.values()]
            seccomp_fd = None
            if use_seccomp:
                seccomp_fd = _memfd(fds, "sandcell-seccomp", seccomp.build_filter())
                passed.append(seccomp_fd)
            argv = build_argv(
                binds=binds,
                system=root.system(image_root),
                etc_data=etc,
                env={**dict(policy.image_env), **_daemon_env(*identity)},
                seccomp_fd=seccomp_fd,
                scratch=scratch_sizes(policy),
                command=[*root.python, *_daemon_args(policy, listener.fileno(), use_landlock)],
                chdir=root.chdir,
            )
            script = launch.script(
                cgroup_procs=cgroup.procs_files if cgroup else [],
                rlimits=launch.Rlimits(policy.nofile, policy.disk_mb),
                bwrap_argv=argv,
                root=(info.uid, stage_lines) if self.privileged else None,
            )
            self._procs[info.cell_id] = _popen(cell_dir / "cell.log", script, passed)

    def _binds(self, cell_dir: Path, root: _Root) -> tuple[list[str], list[Bind], str]:
        """The launcher's staging lines, bwrap's binds into the cell, and where bwrap finds
        the image's root (staged like the binds, never bound whole: `root.system` binds its
        entries)."""
        wanted = [Bind(str(cell_dir / "workspace"), CELL_WORKSPACE, writable=True), *root.binds]
        if root.image_root:
            wanted.append(Bind(root.image_root, ""))
        if not self.privileged:
            return [], wanted[: len(wanted) - bool(root.image_root)], root.image_root
        lines, binds = launch.stage(wanted)
        if not root.image_root:
            return lines, binds, ""
        return lines, binds[:-1], binds[-1].source

    def _wait_healthy(self, cell_id: str, uds: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        proc = self._procs.get(cell_id)
        transport, base = transport_for({"uds": str(uds)})
        with httpx.Client(transport=transport, base_url=base, timeout=2) as client:
            while time.monotonic() < deadline:
                if proc is not None and proc.poll() is not None:
                    raise CellError(f"cell exited during start-up: {self._log_tail(cell_id)}")
                if uds.exists() and health.probe_sync({}, client=client):
                    return
                time.sleep(0.005)
        raise CellError(f"cell did not become healthy: {self._log_tail(cell_id)}")

    def _log_tail(self, cell_id: str) -> str:
        try:
            text = (self.cells_dir / cell_id / "cell.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text.strip()[-2000:] or "(empty log)"

    @staticmethod
    def _read_info(cell_dir: Path) -> CellInfo | None:
        try:
            return CellInfo(**json.loads((cell_dir / "meta.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None


def scratch_sizes(policy: CellPolicy) -> tuple[int, int]:
    """Bytes of /tmp and /dev/shm. Both are tmpfs, charged to the cell's memory: kept well
    below memory_mb so that filling them is an ENOSPC for the writer, not an OOM kill."""
    mib = 1024 * 1024
    return min(policy.disk_mb, policy.memory_mb // 2) * mib, policy.memory_mb // 8 * mib


def _kept_workspace(cell_dir: Path) -> Path | None:
    """The kept workspace a cell is to run on, while it is still where the manager kept it."""
    try:
        home = Path((cell_dir / WORKSPACE_HOME).read_text())
    except OSError:
        return None
    return home if home.exists() else None


def _send_workspace_home(cell_dir: Path) -> None:
    """A destroyed cell's workspace goes back home if it has one (see WORKSPACE_HOME); the
    workspace is already unmounted, so an image moves whole."""
    try:
        home = Path((cell_dir / WORKSPACE_HOME).read_text())
    except OSError:
        return
    image, workspace = cell_dir / "disk.img", cell_dir / "workspace"
    source = image if image.exists() else workspace
    if source.exists() and not home.exists():
        home.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.rename(source, home)


def _runs_as(uid: int) -> bool:
    """Whether a live process runs as `uid` (the owner of its /proc entry: a cell's bwrap
    processes are, for as long as the cell lives; ~0.3 ms per 100 processes). A zombie does
    not count: it runs nothing, and its parent may take its time to reap it."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if entry.stat(follow_symlinks=False).st_uid == uid and not _zombie(entry.path):
                    return True
    return False


def _zombie(proc: str) -> bool:
    with open(f"{proc}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def _stale_claim(claim: Path) -> bool:
    try:
        return not Path(claim.read_text()).is_dir()
    except OSError:
        return False  # being written right now, or unreadable: not ours to take


def _cgroup_name(cell_id: str) -> str:
    return f"cell-{cell_id}"


# passwd/group/hosts of the cell's own (the host's users are none of its business), handed to
# bwrap as memfds: no host file to name in the cell's mount table.
ETC_FILES = {
    "passwd": f"root:x:0:0::/:/usr/sbin/nologin\n"
    f"sandbox:x:{CELL_UID}:{CELL_UID}::{CELL_WORKSPACE}:/bin/sh\n"
    "nobody:x:65534:65534::/:/usr/sbin/nologin\n",
    "group": f"root:x:0:\nsandbox:x:{CELL_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandcell\n::1 localhost ip6-localhost\n",
    "hostname": "sandcell\n",
}


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
    )
    return ["-s", "-B", "-m", "sandcell.daemon", *args]


@dataclass(frozen=True)
class _Root:
    """What the cell's / is made of: the host's system dirs, or a built image with the
    daemon's runtime staged beside it (SPEC §12). The one place the two kinds differ."""

    binds: list[Bind]
    python: list[str]
    chdir: str
    image_root: str = ""

    @classmethod
    def of(cls, cell_dir: Path, policy: CellPolicy) -> _Root:
        if policy.image_root is None:
            binds = [Bind(m.host, m.cell) for m in runtime_mounts()]
            return cls(binds, [cell_python()], CELL_SRC)
        try:
            staged = stage.stage_runtime(cell_dir)
        except stage.StageError as exc:
            raise CellError(str(exc)) from None
        return cls(staged.binds, staged.python, staged.chdir, policy.image_root)

    def system(self, image_root: str) -> list[str]:
        """bwrap's arguments for the read-only system; `image_root` as bwrap reaches it."""
        if not self.image_root:
            return host_system({p: os.readlink(p) for p in SYSTEM_LINKS if os.path.islink(p)})
        return stage.root_args(image_root, sorted(os.listdir(self.image_root)))


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


@contextlib.contextmanager
def _listen(path: str) -> Iterator[socket.socket]:
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


def _memfd(fds: contextlib.ExitStack, name: str, data: bytes) -> int:
    """`data` in an anonymous file for bwrap to read; closed when `fds` unwinds."""
    fd = os.memfd_create(name)  # close-on-exec; pass_fds hands it to the launcher alone
    fds.callback(os.close, fd)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
