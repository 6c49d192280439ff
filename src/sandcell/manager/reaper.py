"""Expiry (SPEC §6, §13): the reaper's passes over the store, apart from provisioning.

Each pass deletes (or, for `on_timeout: "pause"`, pauses) the sandboxes past their idle or
lifetime deadline, deletes the paused ones past their paused TTL and those whose daemon died,
and retries the teardowns that failed. It only decides; the manager's own create, pause and
delete paths do the work, so a reaped sandbox goes exactly as a user's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import time
from typing import TYPE_CHECKING

from sandcell.audit.trail import SYSTEM
from sandcell.cellapi.health import ProbeInconclusive
from sandcell.errors import ServiceError
from sandcell.logs import counted
from sandcell.manager.persistence import MOVING
from sandcell.store import SandboxRecord

if TYPE_CHECKING:
    from sandcell.manager.manager import Manager

log = logging.getLogger("sandcell.manager")

DEFAULT_REAP_INTERVAL_S = 5.0
DEAD_AFTER_PROBES = 2
# Deadlines met in one pass are kept together, so one slow pause (a workspace being kept)
# does not hold back the deletions due at the same moment.
EXPIRE_AT_ONCE = 8
MAX_ENDS_KEPT = 10_000  # ends asked for and still ahead; past it, the interval alone


class Reaper:
    def __init__(self, manager: Manager, interval_s: float = DEFAULT_REAP_INTERVAL_S) -> None:
        self.m = manager
        self.interval_s = interval_s
        self._unhealthy: dict[str, int] = {}  # sandbox id -> failed probes in a row
        self._task: asyncio.Task[None] | None = None
        self._next_pass = 0.0  # wall-clock time of the next pass
        self._ends: list[float] = []  # a heap of the ends asked for that are still ahead
        self._sooner = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def due_at(self, when: float) -> None:
        """A sandbox ends at `when` (a timeout just set): the next pass runs then, so an end
        sooner than a pass away is kept to the moment, not up to `interval_s` late."""
        if len(self._ends) < MAX_ENDS_KEPT:
            heapq.heappush(self._ends, when)
        if when < self._next_pass:
            self._next_pass = when
            self._sooner.set()

    async def reap_once(self, now: float | None = None) -> list[str]:
        """Sandboxes past their idle or lifetime deadline are deleted, or paused if they were
        created with on_timeout "pause"; paused ones past their paused TTL and those whose
        daemon died are deleted."""
        records = await self.m.store.list_sandboxes()  # one listing for both passes below
        retried = await self.m.retry_teardowns(records)
        due = await self.m.store.due_for_reaping(now or time.time(), limit=500)
        dead = await self._dead_daemons(set(due), records)
        await self._expire_all(due)
        for sandbox_id in dead:
            await self.m.delete_sandbox(sandbox_id)
        return retried + [d for d in due if d not in retried] + dead

    async def _expire_all(self, due: list[str]) -> None:
        gate = asyncio.Semaphore(EXPIRE_AT_ONCE)

        async def expire(sandbox_id: str) -> None:
            async with gate:
                await self._expire(sandbox_id)

        results = await asyncio.gather(*map(expire, due), return_exceptions=True)
        for sandbox_id, result in zip(due, results, strict=True):
            if isinstance(result, Exception):  # the others went; this one is due next pass
                log.error("sandbox %s could not be expired: %s", sandbox_id, result)

    async def _expire(self, sandbox_id: str) -> None:
        """A sandbox at its deadline goes; one made with on_timeout "pause" is paused
        instead when it can be. When it cannot (no workspace can be kept here, 501; or its
        key keeps `max_paused_per_key` paused sandboxes already, 409) it is deleted: its
        deadline is the operator's bound on what runs, the paused bound the one on what is
        kept, and neither gives way to the other. It is logged, with the reason."""
        record = await self.m.store.get_sandbox(sandbox_id)
        if record is None or record.state in MOVING:
            return  # gone, or moving: whoever moves it owns it now
        if self.m.audit is not None:  # what follows (pause or delete) is recorded too
            self.m.audit.note("sandbox.timeout", sandbox_id=sandbox_id, caller=SYSTEM)
        if record.state == "running" and record.on_timeout == "pause":
            try:
                await self.m.persistence.pause(sandbox_id)
                return
            except ServiceError as exc:
                log.warning(
                    "sandbox %s of %s could not be paused at its timeout, deleted instead: %s",
                    sandbox_id,
                    record.owner,
                    exc.message,
                )
        await self.m.delete_sandbox(sandbox_id)

    async def _dead_daemons(self, skip: set[str], records: list[SandboxRecord]) -> list[str]:
        """Sandboxes whose daemon failed DEAD_AFTER_PROBES health probes in a row (one slow
        answer under load is not a death)."""
        dead: list[str] = []
        seen: set[str] = set()
        for record in records:
            if record.id in skip or record.state != "running":
                continue  # a deletion under way owns it
            seen.add(record.id)
            try:
                healthy = await self.m.backend.healthy(record.endpoint)
            except ProbeInconclusive as exc:
                # Out of descriptors here says nothing of the cells: judge them next pass.
                log.warning("health probes skipped: %s", exc.message)
                return dead
            if healthy:
                self._unhealthy.pop(record.id, None)
                continue
            self._unhealthy[record.id] = self._unhealthy.get(record.id, 0) + 1
            if self._unhealthy[record.id] >= DEAD_AFTER_PROBES:
                dead.append(record.id)
        for gone in set(self._unhealthy) - seen:
            del self._unhealthy[gone]
        return dead

    async def _forever(self) -> None:
        last_pass = time.time()
        while True:
            while self._ends and self._ends[0] <= last_pass:  # that pass saw to these
                heapq.heappop(self._ends)
            soonest = self._ends[0] if self._ends else math.inf
            self._next_pass = min(time.time() + self.interval_s, soonest)
            while (wait := self._next_pass - time.time()) > 0:
                self._sooner.clear()
                # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that
                # arrives as its wait ends, and stop() would then wait out a whole pass.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._sooner.wait()
            last_pass = time.time()
            try:
                reaped = await self.reap_once(last_pass)
            except Exception:
                log.exception("reaper pass failed")
                continue
            if reaped:
                log.info("reaped %s", counted(len(reaped), "sandbox", "sandboxes"))
