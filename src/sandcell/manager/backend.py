"""Where cells come from. The manager sees only this interface, so Kubernetes slots in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandcell.cellapi import health
from sandcell.errors import ErrorCode, SandcellError
from sandcell.isolation import usage
from sandcell.isolation.cell import LocalCells, new_cell_id
from sandcell.isolation.policy import CellPolicy
from sandcell.isolation.usage import CellUsage


@dataclass(frozen=True)
class CellHandle:
    """`endpoint` reaches the daemon; `cell` is the backend's own handle (JSON-safe)."""

    endpoint: dict[str, Any]
    cell: dict[str, Any]


class Backend(Protocol):
    name: str

    async def create(
        self, policy: CellPolicy, sandbox_id: str, bootstrap_pem: bytes
    ) -> CellHandle: ...

    async def destroy(self, cell: dict[str, Any]) -> None: ...

    async def list(self) -> list[CellHandle]: ...

    async def healthy(self, endpoint: dict[str, Any]) -> bool: ...

    def owns(self, cell: dict[str, Any]) -> bool:
        """Whether this backend instance made the cell (replicas reconcile only their own)."""
        ...

    async def usage(self, cell: dict[str, Any]) -> CellUsage:
        """What the cell uses now (SPEC §9 metrics)."""
        ...


class LocalBackend:
    """Cells on this machine (bubblewrap); blocking work runs in threads."""

    name = "local"

    def __init__(self, cells_dir: Path, cgroup_parent: str = "sandcell") -> None:
        self.cells = LocalCells(cells_dir, cgroup_parent=cgroup_parent)
        self.cgroup_parent = cgroup_parent
        self._neighbours: dict[str, LocalCells] = {}

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

    async def create(self, policy: CellPolicy, sandbox_id: str, bootstrap_pem: bytes) -> CellHandle:
        cell_id = new_cell_id()
        info = await asyncio.to_thread(
            self.cells.create, cell_id, policy, sandbox_id, bootstrap_pem
        )
        return self._handle(info.cell_id, info.uds)

    async def destroy(self, cell: dict[str, Any]) -> None:
        await asyncio.to_thread(self._cells_of(cell).destroy, str(cell["cell_id"]))

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
            raise SandcellError(ErrorCode.SANDBOX_NOT_FOUND, f"cell {cell_id} is gone")
        cgroup = cells.cgroups.open(info.cgroup) if cells.cgroups and info.cgroup else None
        return await asyncio.to_thread(usage.measure, cgroup, info.workspace)
