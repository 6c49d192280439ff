"""Local cells: a daemon and everything it runs, confined together (SPEC §3).

A cell is launched as root in four steps, each one process image, no Python in between:

    sh (join the cell's cgroups, set rlimits)
      -> unshare --mount (a private mount namespace: the stage below dies with the cell)
      -> setpriv (drop to the cell's unprivileged host uid, no_new_privs)
      -> bwrap (user/pid/mount/ipc/uts/cgroup/net namespaces, seccomp) -> python daemon

Nothing of a cell outlives `destroy()`: its cgroup is killed and removed, the private mount
namespace goes with its last process, the workspace is unmounted and its directory deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from sandcell.cellapi import health
from sandcell.cellapi.argv import daemon_args
from sandcell.cellapi.client import transport_for
from sandcell.cellapi.environment import FIXED_PATH
from sandcell.isolation import cgroups, disk, landlock, seccomp
from sandcell.isolation.bwrap import (
    CELL_RUN_DIR,
    CELL_SOCKET,
    CELL_UID,
    CELL_WORKSPACE,
    SYSTEM_LINKS,
    Bind,
    build_argv,
    host_system,
)
from sandcell.isolation.images import stage
from sandcell.isolation.policy import CellPolicy
from sandcell.isolation.runtime import CELL_SRC, cell_python, runtime_mounts

STAGE = "/run/sandcell-stage"
UID_REGISTRY = Path("/run/sandcell-uids")
DEFAULT_UID_BASE = 200_000
DEFAULT_UID_COUNT = 10_000
START_TIMEOUT_S = 20.0
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
            Path(STAGE).mkdir(mode=0o755, parents=True, exist_ok=True)

    # -- lifecycle -------------------------------------------------------------------------

    def create(
        self, cell_id: str, policy: CellPolicy, sandbox_id: str, bootstrap_public_pem: bytes
    ) -> CellInfo:
        """Starts a cell and waits until its daemon answers /health; cleans up on failure."""
        cell_dir = self.cells_dir / _check_id(cell_id)
        cell_dir.mkdir(mode=0o700)
        try:
            info = self._start(cell_dir, cell_id, policy, sandbox_id, bootstrap_public_pem)
            self._wait_healthy(cell_id, Path(info.uds))
            return info
        except BaseException:
            self.destroy(cell_id)
            raise

    def destroy(self, cell_id: str) -> None:
        """Kills every process of the cell and removes all it had on the host. Idempotent,
        and safe to call concurrently (a user's delete racing the reaper)."""
        with self._lock:
            lock = self._destroying.setdefault(cell_id, threading.Lock())
        with lock:
            self._destroy(cell_id)
        with self._lock:
            self._destroying.pop(cell_id, None)

    def _destroy(self, cell_id: str) -> None:
        cell_dir = self.cells_dir / _check_id(cell_id)
        info = self._read_info(cell_dir)
        cgroup_name = info.cgroup if info else _cgroup_name(cell_id)
        if self.cgroups is not None and (cg := self.cgroups.open(cgroup_name)) is not None:
            cg.destroy()
        proc = self._procs.pop(cell_id, None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        disk.release_workspace(cell_dir / "workspace")
        shutil.rmtree(cell_dir, ignore_errors=True)
        if info is not None and self.privileged:
            with contextlib.suppress(OSError):
                claim = UID_REGISTRY / str(info.uid)
                if claim.read_text() == str(cell_dir):
                    claim.unlink()

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
        self, cell_dir: Path, cell_id: str, policy: CellPolicy, sandbox_id: str, pem: bytes
    ) -> CellInfo:
        uid = self._allocate_uid(cell_dir) if self.privileged else os.geteuid()
        workspace, run_dir = cell_dir / "workspace", cell_dir / "run"
        quota = policy.require("disk_quota", *disk.loop_quota_available())
        if quota:
            disk.create_quota_workspace(cell_dir / "disk.img", workspace, policy.disk_mb, uid)
        else:
            disk.create_plain_workspace(workspace, uid)
        run_dir.mkdir(mode=0o700)
        if self.privileged:
            os.chown(run_dir, uid, uid)
        _write_etc(cell_dir / "etc")
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
        self._spawn(cell_dir, info, policy, sandbox_id, pem, cgroup)
        return info

    def _allocate_uid(self, cell_dir: Path) -> int:
        """A host uid no other cell on this host holds, whichever sandcell made it: claims
        are files in a host-wide registry naming the claiming cell's directory; a claim
        whose directory is gone (a crash, a destroyed cell) is free again."""
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
                return uid
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
        sandbox_id: str,
        pem: bytes,
        cgroup: cgroups.CellCgroup | None,
    ) -> None:
        use_seccomp = policy.require("seccomp", True, "")
        use_landlock = policy.require(
            "landlock", landlock.abi_version() > 0, "the kernel has no Landlock"
        )
        root = _Root.of(cell_dir, policy)
        stage_binds, cell_binds, etc_dir, image_root = self._binds(cell_dir, root)
        etc = {f"/etc/{name}": f"{etc_dir}/{name}" for name in ETC_FILES}
        seccomp_fd = _memfd("sandcell-seccomp", seccomp.build_filter()) if use_seccomp else None
        args = daemon_args(
            uds=CELL_SOCKET,
            disk_quota_mb=policy.disk_mb,
            inherit_env=policy.inherit_env,
            landlock=use_landlock,
            deny_tcp=policy.network == "none",
        )
        daemon = [*root.python, "-s", "-B", "-m", "sandcell.daemon", *args]
        env = {
            **dict(policy.image_env),
            "PATH": FIXED_PATH,
            "HOME": CELL_WORKSPACE,
            "LANG": "C.UTF-8",
            "SANDCELL_SANDBOX_ID": sandbox_id,
            "SANDCELL_WORKSPACE": CELL_WORKSPACE,
            "SANDCELL_BOOTSTRAP_PUBLIC_KEY": pem.decode(),
        }
        argv = build_argv(
            binds=cell_binds,
            system=root.system(image_root),
            etc_files=etc,
            env=env,
            seccomp_fd=seccomp_fd,
            scratch=scratch_sizes(policy),
            command=daemon,
            chdir=root.chdir,
        )
        script = self._launch_script(info, policy, cgroup, stage_binds, argv)
        log = open(cell_dir / "cell.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self._procs[info.cell_id] = subprocess.Popen(
                ["/bin/sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                start_new_session=True,
                env={"PATH": FIXED_PATH},
                cwd="/",
            )
        finally:
            log.close()
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def _binds(self, cell_dir: Path, root: _Root) -> tuple[list[Bind], list[Bind], str, str]:
        """Root's binds onto the stage, bwrap's binds into the cell, where bwrap finds the
        cell's generated /etc files, and where it finds the image's root (if any)."""
        wanted = [
            Bind(str(cell_dir / "workspace"), CELL_WORKSPACE, writable=True),
            Bind(str(cell_dir / "run"), CELL_RUN_DIR, writable=True),
            *root.binds,
        ]
        if not self.privileged:
            return [], wanted, str(cell_dir / "etc"), root.image_root
        stage = [Bind(str(cell_dir / "etc"), f"{STAGE}/etc")]
        if root.image_root:
            stage.append(Bind(root.image_root, f"{STAGE}/image"))
        cell = []
        for index, bind in enumerate(wanted):
            staged = f"{STAGE}/{index}"
            stage.append(Bind(bind.source, staged, bind.writable))
            cell.append(Bind(staged, bind.dest, bind.writable))
        return stage, cell, f"{STAGE}/etc", root.image_root and f"{STAGE}/image"

    def _launch_script(
        self,
        info: CellInfo,
        policy: CellPolicy,
        cgroup: cgroups.CellCgroup | None,
        stage: list[Bind],
        bwrap_argv: list[str],
    ) -> str:
        q = shlex.quote
        lines = ["set -eu"]
        for procs in cgroup.procs_files if cgroup else []:
            lines.append(f"echo $$ > {q(procs)}")
        fsize_blocks = policy.disk_mb * 2048  # dash counts ulimit -f in 512-byte blocks
        lines.append(f"ulimit -c 0; ulimit -n {policy.nofile}; ulimit -f {fsize_blocks}")
        bwrap = " ".join(q(a) for a in bwrap_argv)
        if not self.privileged:
            lines.append(f"exec {bwrap}")
            return "\n".join(lines)
        inner = [f"mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev sandcell-stage {STAGE}"]
        for bind in stage:
            inner.append(f"mkdir {q(bind.dest)} && mount --bind {q(bind.source)} {q(bind.dest)}")
        inner.append(
            f"exec setpriv --reuid={info.uid} --regid={info.uid} --clear-groups"
            f" --no-new-privs --bounding-set=-all -- {bwrap}"
        )
        lines.append(
            "exec unshare --mount --propagation private -- /bin/sh -c "
            + q("set -eu\n" + "\n".join(inner))
        )
        return "\n".join(lines)

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


def scratch_sizes(policy: CellPolicy) -> tuple[int, int]:
    """Bytes of /tmp and /dev/shm. Both are tmpfs, charged to the cell's memory: kept well
    below memory_mb so that filling them is an ENOSPC for the writer, not an OOM kill."""
    mib = 1024 * 1024
    return min(policy.disk_mb, policy.memory_mb // 2) * mib, policy.memory_mb // 8 * mib


def _stale_claim(claim: Path) -> bool:
    try:
        return not Path(claim.read_text()).is_dir()
    except OSError:
        return False  # being written right now, or unreadable: not ours to take


def _cgroup_name(cell_id: str) -> str:
    return f"cell-{cell_id}"


ETC_FILES = {
    "passwd": f"root:x:0:0::/:/usr/sbin/nologin\n"
    f"sandbox:x:{CELL_UID}:{CELL_UID}::{CELL_WORKSPACE}:/bin/sh\n"
    "nobody:x:65534:65534::/:/usr/sbin/nologin\n",
    "group": f"root:x:0:\nsandbox:x:{CELL_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandcell\n::1 localhost ip6-localhost\n",
    "hostname": "sandcell\n",
}


def _write_etc(etc: Path) -> None:
    """passwd/group/hosts of the cell's own: the host's users are none of its business."""
    etc.mkdir(mode=0o755)
    for name, content in ETC_FILES.items():
        (etc / name).write_text(content)
        (etc / name).chmod(0o644)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec; pass_fds hands it to bwrap alone
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
