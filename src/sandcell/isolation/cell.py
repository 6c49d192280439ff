"""Local cells: a daemon and everything it runs, confined together (SPEC §3).

This module holds a cell's lifecycle on this host: its directory and record, its workspace,
its cgroup, and its teardown. The rest has a module of its own: the host uid each cell runs as
(isolation/uids.py), what its filesystem is made of and how it is staged (isolation/staging.py),
and the launcher that starts it (isolation/launch.py).

Nothing of a cell outlives `destroy()`: its cgroup is killed and removed, its PID namespace is
killed through its init, every process of its host uid is killed (the one kill switch that
needs neither a cgroup nor the launcher's process, see uids.py), the private mount namespace
goes with its last process, the workspace is unmounted and its directory deleted.
"""

from __future__ import annotations

import builtins  # `LocalCells.list` shadows the builtin in its class body
import contextlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from sandcell.cellapi import health
from sandcell.cellapi.client import transport_for
from sandcell.isolation import cgroups, disk, launch, staging, uids
from sandcell.isolation.launch import CellError  # also imported from here (CLI, tests)
from sandcell.isolation.policy import CellPolicy
from sandcell.isolation.runtime import compile_package
from sandcell.isolation.uids import (  # noqa: F401 - UID_REGISTRY: imported from here by tests
    DEFAULT_UID_BASE,
    DEFAULT_UID_COUNT,
    UID_REGISTRY,
)

log = logging.getLogger("sandcell.isolation.cell")
START_TIMEOUT_S = 20.0
# In a cell's dir: where its workspace goes when the cell is destroyed, instead of being deleted
# (a pause, SPEC §13). Written before the workspace moves in, so no crash can lose it.
WORKSPACE_HOME = "workspace.home"
_ID_ALPHABET = set("abcdefghijklmnopqrstuvwxyz0123456789-")


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
            Path(staging.STAGE).mkdir(mode=0o755, parents=True, exist_ok=True)
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
        removing anything: `destroy` does the rest. A cell made without a cgroup is killed
        through its PID namespace and its uid, both part of `destroy`: it is destroyed here."""
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
            launch.kill(proc)
        # Unprivileged, the cell runs as its caller's own uid: never a handle to kill by.
        uid = (info.uid if info else uids.claimed_by(cell_dir)) if self.privileged else None
        # Whatever the cgroup and the launcher missed: all of a cell without a cgroup that this
        # LocalCells did not start (a restarted manager, a replica beside it).
        if uid is not None and (survivors := uids.kill_all(uid)):
            log.error("cell %s: processes %s of uid %d survive SIGKILL", cell_id, survivors, uid)
        disk.release_workspace(cell_dir / "workspace")
        _send_workspace_home(cell_dir)
        shutil.rmtree(cell_dir, ignore_errors=True)
        if uid is not None:
            uids.release(uid, cell_dir)

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

    def destroy_all(self) -> builtins.list[str]:
        """Destroys every cell under this directory, records or not; returns their ids
        (shutting a host down, cleaning up after tests and benchmarks)."""
        ids = [i.cell_id for i in self.list()] + self.leftovers()
        for cell_id in ids:
            self.destroy(cell_id)
        return ids

    def leftovers(self) -> builtins.list[str]:
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
        with launch.listen(info.uds) as listener:
            self._procs[cell_id] = launch.start(
                cell_dir, uid, policy, identity, cgroup, listener, privileged=self.privileged
            )
        return info

    def _allocate_uid(self, cell_dir: Path) -> int:
        try:
            return uids.claim(cell_dir, self.uid_base, self.uid_count)
        except uids.NoFreeUid as exc:
            raise CellError(str(exc)) from None

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


def _cgroup_name(cell_id: str) -> str:
    return f"cell-{cell_id}"
