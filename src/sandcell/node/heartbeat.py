"""A node's place in the roster (SPEC §18): its report (capacity, free figures, live cells),
registered at start, sent again every HEARTBEAT_INTERVAL_S, and removed at a clean stop.

Capacity is the host's memory and CPUs and the data dir's disk, or less when the operator
says so; the free figures are the capacity less what the node's sandboxes' templates hold (a
warm pooled cell is free capacity, as the roster's rules say). A heartbeat the store does not
take (an outage) is logged and the next one tries again: missing a few is what makes a node
unreachable, which is the truth then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandcell import __version__
from sandcell.manager.backend import Backend
from sandcell.manager.templates import Template
from sandcell.store import NodeRecord, Store
from sandcell.store.nodes import HEARTBEAT_INTERVAL_S

log = logging.getLogger("sandcell.node")
MB = 1 << 20


@dataclass(frozen=True)
class Capacity:
    memory_mb: int
    cpus: float
    cells: int
    disk_mb: int

    @classmethod
    def of_host(cls, data_dir: Path, cells: int) -> Capacity:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MB
        disk = shutil.disk_usage(data_dir).total // MB
        return cls(int(memory), float(len(os.sched_getaffinity(0))), cells, int(disk))


@dataclass
class Heartbeat:
    store: Store
    backend: Backend
    templates: dict[str, Template]
    name: str
    address: str
    capacity: Capacity
    labels: dict[str, str] = field(default_factory=dict)
    interval_s: float = HEARTBEAT_INTERVAL_S
    _task: asyncio.Task[None] | None = None

    async def report(self) -> NodeRecord:
        """One registration or heartbeat, with the figures as of now."""
        mine = [
            r
            for r in await self.store.list_sandboxes()
            if r.state != "deleted" and self.backend.owns(r.cell)
        ]
        held = [self.templates[r.template] for r in mine if r.template in self.templates]
        c = self.capacity
        return await self.store.register_node(
            NodeRecord(
                name=self.name,
                address=self.address,
                version=__version__,
                heartbeat_at=time.time(),
                memory_mb=c.memory_mb,
                cpus=c.cpus,
                cells=c.cells,
                disk_mb=c.disk_mb,
                free_memory_mb=max(0, c.memory_mb - sum(t.memory_mb for t in held)),
                free_cpus=max(0.0, c.cpus - sum(t.cpus for t in held)),
                free_disk_mb=max(0, c.disk_mb - sum(t.disk_mb for t in held)),
                live_cells=len(mine),
                labels=self.labels,
            )
        )

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.report()
            except Exception as exc:  # an outage: the next beat tries again
                log.warning("heartbeat not stored: %s", exc)

    async def stop(self) -> None:
        """Stops beating and leaves the roster (a node that comes back registers anew)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.store.remove_node(self.name)
        except Exception as exc:
            log.warning("could not leave the roster: %s (it turns unreachable by itself)", exc)
