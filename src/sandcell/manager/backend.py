"""Where cells come from. The manager sees only this interface, so Kubernetes slots in."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandcell.cellapi import health
from sandcell.errors import ErrorCode, ServiceError
from sandcell.isolation import disk, usage
from sandcell.isolation.cell import CellInfo, LocalCells, new_cell_id
from sandcell.isolation.policy import CellPolicy, IsolationUnavailable
from sandcell.isolation.usage import CellUsage
from sandcell.network import bridge
from sandcell.network.egress import EgressService

log = logging.getLogger("sandcell.manager.backend")


@dataclass(frozen=True)
class CellHandle:
    """`endpoint` reaches the daemon; `cell` is the backend's own handle (JSON-safe)."""

    endpoint: dict[str, Any]
    cell: dict[str, Any]


class Backend(Protocol):
    name: str

    async def create(
        self,
        policy: CellPolicy,
        sandbox_id: str,
        bootstrap_pem: bytes,
        workspace: str | None = None,
    ) -> CellHandle:
        """A started cell; on `workspace` (a `workspace_home`) instead of a new one if given."""
        ...

    async def cell_trust(self, sandbox_id: str) -> dict[str, str]:
        """For a sandbox with secrets (SPEC §17), before its cell is made: its CA minted and
        its bundle staged for the cell; the env that points the cell's clients at it."""
        ...

    async def stop(self, cell: dict[str, Any]) -> None:
        """Every process of the cell killed, quickly: a deletion answers after this and
        leaves the slower `destroy` to the background."""
        ...

    async def destroy(self, cell: dict[str, Any]) -> None: ...

    def workspace_home(self, sandbox_id: str) -> str:
        """Where a paused sandbox's workspace is kept (SPEC §13); 501 where none can be."""
        ...

    async def keep_workspace(self, cell: dict[str, Any], home: str) -> None:
        """Destroying the cell from now on moves its workspace to `home`, not deleting it."""
        ...

    async def discard_workspace(self, home: str) -> None:
        """Deletes a kept workspace or a snapshot; no-op if there is none."""
        ...

    def snapshot_path(self, snapshot_id: str) -> str:
        """Where a snapshot's copy lives; 501 where snapshots cannot be taken."""
        ...

    async def workspace_bytes(self, cell: dict[str, Any] | None, home: str) -> int:
        """What a copy of the workspace would take: the live cell's, or (None) the kept one."""
        ...

    async def copy_workspace(self, cell: dict[str, Any] | None, home: str, dest: str) -> int:
        """A consistent copy at `dest` (the live cell frozen meanwhile); its bytes."""
        ...

    async def thaw(self, cell: dict[str, Any]) -> None:
        """Undoes a freeze that a crash mid-snapshot left on the cell."""
        ...

    async def list(self) -> list[CellHandle]: ...

    async def healthy(self, endpoint: dict[str, Any]) -> bool: ...

    async def adopt(self, sandbox_id: str, handle: CellHandle) -> None:
        """A live cell found after a restart is kept: reattach what this process serves it."""
        ...

    def owns(self, cell: dict[str, Any]) -> bool:
        """Whether this backend instance made the cell (replicas reconcile only their own)."""
        ...

    async def usage(self, cell: dict[str, Any]) -> CellUsage:
        """What the cell uses now (SPEC §9 metrics)."""
        ...


class LocalBackend:
    """Cells on this machine (bubblewrap); blocking work runs in threads."""

    name = "local"

    def __init__(
        self,
        cells_dir: Path,
        cgroup_parent: str = "sandcell",
        egress: EgressService | None = None,
    ) -> None:
        self.cells = LocalCells(cells_dir, cgroup_parent=cgroup_parent)
        self.cgroup_parent = cgroup_parent
        self.egress = egress
        self._neighbours: dict[str, LocalCells] = {}
        self._sandbox_of: dict[str, str] = {}  # cell id -> sandbox id, for the egress listeners
        self._trust_dirs: dict[str, str] = {}  # sandbox id -> its CA bundle's directory

    def _handle(self, cell_id: str, uds: str) -> CellHandle:
        cell = {"cell_id": cell_id, "cells_dir": str(self.cells.cells_dir)}
        return CellHandle({"uds": uds}, cell)

    def owns(self, cell: dict[str, Any]) -> bool:
        return cell.get("cells_dir") == str(self.cells.cells_dir)

    def _cells_of(self, cell: dict[str, Any]) -> LocalCells:
        """A replica on this host may delete another's cell: it lives in that one's dir."""
        if self.owns(cell):
            return self.cells
        cells_dir = str(cell["cells_dir"])
        if cells_dir not in self._neighbours:
            self._neighbours[cells_dir] = LocalCells(
                Path(cells_dir), cgroup_parent=self.cgroup_parent
            )
        return self._neighbours[cells_dir]

    async def create(
        self,
        policy: CellPolicy,
        sandbox_id: str,
        bootstrap_pem: bytes,
        workspace: str | None = None,
    ) -> CellHandle:
        await self._forget_destroyed()
        if (ca_dir := self._trust_dirs.pop(sandbox_id, None)) is not None:
            policy = dataclasses.replace(policy, ca_dir=ca_dir)
        cell_id = new_cell_id()
        kept = Path(workspace) if workspace else None
        info = await asyncio.to_thread(
            self.cells.create, cell_id, policy, sandbox_id, bootstrap_pem, kept
        )
        try:
            await self._attach_egress(sandbox_id, info)
        except BaseException:
            await self.destroy({"cell_id": info.cell_id, "cells_dir": str(self.cells.cells_dir)})
            raise
        return self._handle(info.cell_id, info.uds)

    async def cell_trust(self, sandbox_id: str) -> dict[str, str]:
        substitution = self.egress.substitution if self.egress is not None else None
        if substitution is None:
            return {}  # no egress proxy: nothing of the cell leaves, nothing to substitute
        trust = await asyncio.to_thread(substitution.authorities.trust_for, sandbox_id, ())
        self._trust_dirs[sandbox_id] = str(trust.directory)
        return trust.env

    async def _attach_egress(self, sandbox_id: str, info: CellInfo) -> None:
        """The egress proxies' listeners, made inside the cell before any tenant code runs."""
        if self.egress is None or not self.cells.privileged:
            return  # entering a cell's namespace needs root: without it nothing leaves at all
        try:
            pid = await asyncio.to_thread(bridge.cell_pid, info.uid)
            http, socks = await asyncio.to_thread(bridge.listen_in, pid)
        except bridge.BridgeError as exc:
            raise IsolationUnavailable("network", str(exc)) from exc
        self._sandbox_of[info.cell_id] = sandbox_id
        await self.egress.serve(sandbox_id, http, socks)

    async def _forget_destroyed(self) -> None:
        """Closes the listeners of cells that another replica on this host destroyed (their
        sockets would keep the dead cell's network namespace alive)."""
        gone = [c for c in self._sandbox_of if not (self.cells.cells_dir / c).exists()]
        for cell_id in gone:
            if self.egress is not None:
                await self.egress.detach(self._sandbox_of.pop(cell_id))

    async def adopt(self, sandbox_id: str, handle: CellHandle) -> None:
        infos = await asyncio.to_thread(self.cells.list)
        info = next((i for i in infos if i.cell_id == handle.cell["cell_id"]), None)
        if info is None or self.egress is None:
            return
        try:
            await self._attach_egress(sandbox_id, info)
        except IsolationUnavailable:
            # Its code ran before this restart and may hold the ports: it keeps no egress.
            log.warning("sandbox %s: egress listeners could not be restored", sandbox_id)

    async def stop(self, cell: dict[str, Any]) -> None:
        await asyncio.to_thread(self._cells_of(cell).stop, str(cell["cell_id"]))

    async def destroy(self, cell: dict[str, Any]) -> None:
        sandbox_id = self._sandbox_of.pop(str(cell["cell_id"]), None)
        if sandbox_id is not None and self.egress is not None:
            await self.egress.detach(sandbox_id)
        await asyncio.to_thread(self._cells_of(cell).destroy, str(cell["cell_id"]))

    def workspace_home(self, sandbox_id: str) -> str:
        # Beside the cells dir, not in it: a kept workspace is no cell's.
        return str(self.cells.cells_dir.parent / "workspaces" / sandbox_id)

    async def keep_workspace(self, cell: dict[str, Any], home: str) -> None:
        cells = self._cells_of(cell)
        await asyncio.to_thread(cells.keep_workspace, str(cell["cell_id"]), Path(home))

    async def discard_workspace(self, home: str) -> None:
        if home:  # "": none was kept (never Path(""), which is the current directory)
            await asyncio.to_thread(disk.remove_tree, Path(home))

    def snapshot_path(self, snapshot_id: str) -> str:
        return str(self.cells.cells_dir.parent / "snapshots" / snapshot_id)

    async def workspace_bytes(self, cell: dict[str, Any] | None, home: str) -> int:
        if cell is None:
            return await asyncio.to_thread(disk.allocated_bytes, Path(home))
        cells = self._cells_of(cell)
        return await asyncio.to_thread(cells.workspace_bytes, str(cell["cell_id"]))

    async def copy_workspace(self, cell: dict[str, Any] | None, home: str, dest: str) -> int:
        if cell is None:
            return await asyncio.to_thread(disk.copy_workspace, Path(home), Path(dest))
        cells = self._cells_of(cell)
        return await asyncio.to_thread(cells.copy_workspace, str(cell["cell_id"]), Path(dest))

    async def thaw(self, cell: dict[str, Any]) -> None:
        await asyncio.to_thread(self._cells_of(cell).thaw, str(cell["cell_id"]))

    async def list(self) -> list[CellHandle]:
        infos = await asyncio.to_thread(self.cells.list)
        leftovers = await asyncio.to_thread(self.cells.leftovers)
        for cell_id in leftovers:  # half-created before a crash: nothing to adopt
            await asyncio.to_thread(self.cells.destroy, cell_id)
        return [self._handle(i.cell_id, i.uds) for i in infos]

    async def healthy(self, endpoint: dict[str, Any]) -> bool:
        return await health.probe(endpoint)

    async def usage(self, cell: dict[str, Any]) -> CellUsage:
        cells = self._cells_of(cell)
        cell_id = str(cell["cell_id"])
        info = cells._read_info(cells.cells_dir / cell_id)
        if info is None:
            raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"cell {cell_id} is gone")
        cgroup = cells.cgroups.open(info.cgroup) if cells.cgroups and info.cgroup else None
        return await asyncio.to_thread(usage.measure, cgroup, info.workspace)
