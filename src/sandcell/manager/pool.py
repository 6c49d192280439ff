"""Warm pools: cells created and initialised ahead, per template, refilled in the background."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sandcell import tokens
from sandcell.cellapi.health import ProbeInconclusive
from sandcell.manager.backend import Backend, CellHandle

log = logging.getLogger("sandcell.manager.pool")
REFILL_DELAY_S = 0.25


@dataclass
class WarmCell:
    """A ready cell: started, initialised with its own session key, not yet anyone's."""

    sandbox_id: str
    handle: CellHandle
    session_key: tokens.PrivateKey


class WarmPool:
    def __init__(
        self, template: str, size: int, make: Callable[[], Awaitable[WarmCell]], backend: Backend
    ) -> None:
        self.template = template
        self.size = size
        self._make = make
        self._backend = backend
        self._ready: list[WarmCell] = []
        self._filling = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.failures = 0
        self._announced = False

    def __len__(self) -> int:
        return len(self._ready)

    async def claim(self) -> WarmCell | None:
        """A healthy ready cell, or None; dead ones are dropped, never handed out."""
        try:
            while self._ready:
                cell = self._ready.pop(0)
                try:
                    healthy = await self._backend.healthy(cell.handle.endpoint)
                except ProbeInconclusive:
                    self._ready.insert(0, cell)  # unknown is not dead: keep it for later
                    raise
                if healthy:
                    return cell
                await self._backend.destroy(cell.handle.cell)
            return None
        finally:
            # Starting a cell takes a core and the GIL for ~0.5 s: let the claimer's first
            # requests go first.
            asyncio.get_running_loop().call_later(REFILL_DELAY_S, self.refill)

    def refill(self) -> None:
        missing = self.size - len(self._ready) - self._filling
        for _ in range(max(missing, 0)):
            self._filling += 1
            task = asyncio.ensure_future(self._fill_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fill_one(self) -> None:
        try:
            self._ready.append(await self._make())
            if 0 < self.size <= len(self._ready) and not self._announced:
                self._announced = True  # once: refills after each claim are routine
                log.info("warm pool %s: full, %d cells ready", self.template, self.size)
        except Exception:  # a failed fill is counted and retried by the next refill
            self.failures += 1
            log.exception("warm pool %s: could not prepare a cell", self.template)
        finally:
            self._filling -= 1

    async def wait_full(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self._ready) < self.size:
                await asyncio.sleep(0.02)

    async def drain(self) -> int:
        """Destroys every pooled cell and says how many; fills under way finish first (a
        cancelled start would leave a cell that no one owns)."""
        self.size = 0
        await asyncio.gather(*self._tasks, return_exceptions=True)
        drained = len(self._ready)
        while self._ready:
            await self._backend.destroy(self._ready.pop().handle.cell)
        return drained
