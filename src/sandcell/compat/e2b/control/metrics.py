"""E2B's metrics: per-sandbox rings of samples kept in the router process, and the call
that answers a range of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b.control.common import _owned, _refused
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ServiceError
from sandcell.router.auth import Principal
from sandcell.router.usage import metrics_of
from sandcell.store import SandboxRecord

if TYPE_CHECKING:
    from sandcell.router.core import Router

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 5.0  # metrics sampling of the sandboxes /e2b has seen

KEEP_SAMPLES = 720  # per sandbox: an hour at SAMPLE_EVERY_S


class Samples:
    """Per-sandbox rings of E2B metrics samples, kept in this router process (sandcell's
    backend reads a cell's use when asked and keeps no history): a sandbox made, connected
    to or asked about through /e2b is sampled every SAMPLE_EVERY_S and on each metrics call,
    its last KEEP_SAMPLES (an hour) kept, and forgotten when it is deleted. A router that
    restarts starts afresh; another router of a fleet keeps its own."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.rings: dict[str, deque[dict[str, Any]]] = {}
        self.task: asyncio.Task[None] | None = None
        router.on_delete.append(self.forget)

    @classmethod
    def of(cls, router: Router) -> Samples:
        if (samples := _SAMPLES.get(router)) is None:
            samples = _SAMPLES[router] = cls(router)
        return samples

    async def forget(self, sandbox_id: str) -> None:
        self.rings.pop(sandbox_id, None)

    def watch(self, sandbox_id: str) -> deque[dict[str, Any]]:
        ring = self.rings.setdefault(sandbox_id, deque(maxlen=KEEP_SAMPLES))
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())
        return ring

    async def sample(self, record: SandboxRecord) -> None:
        ring = self.watch(record.id)
        if record.state != "running" or (ring and time.time() - ring[-1]["_at"] < 1):
            return
        with contextlib.suppress(ServiceError):  # gone or paused meanwhile: no sample
            m = await metrics_of(self.router, record)
            now = time.time()
            ring.append(
                {
                    "_at": now,
                    "timestamp": m.at,
                    "timestampUnix": int(now),
                    "cpuCount": max(1, math.ceil(m.cpus or 1)),
                    "cpuUsedPct": float(m.cpu_percent or 0.0),
                    "memUsed": int(m.memory_bytes or 0),
                    "memTotal": int(m.memory_limit_bytes or 0),
                    "memCache": 0,
                    "diskUsed": int(m.disk_used_bytes or 0),
                    "diskTotal": int(m.disk_limit_bytes or 0),
                }
            )

    async def _run(self) -> None:
        while self.rings:
            await asyncio.sleep(SAMPLE_EVERY_S)
            for sandbox_id in list(self.rings):
                try:
                    record = await self.router.store.get_sandbox(sandbox_id)
                except Exception:  # a store hiccup: try again next round
                    log.warning("metrics sampling: the store failed", exc_info=True)
                    break
                if record is None or record.state == "deleted":
                    self.rings.pop(sandbox_id, None)
                else:
                    await self.sample(record)


_SAMPLES: weakref.WeakKeyDictionary[Router, Samples] = weakref.WeakKeyDictionary()


def _bound(request: Request, field: str) -> float | None:
    raw = request.query_params.get(field)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise _refused(field, "must be a Unix time in seconds") from None


async def metrics(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """The samples from `start` to `end` (Unix seconds, both inclusive; either open), a
    fresh one taken first when the sandbox runs."""
    record = await _owned(gateway, principal, request)
    start, end = _bound(request, "start"), _bound(request, "end")
    samples = Samples.of(gateway.router)
    await samples.sample(record)
    rows = [
        {k: v for k, v in row.items() if k != "_at"}
        for row in samples.watch(record.id)
        if (start is None or row["_at"] >= start) and (end is None or row["_at"] < end + 1)
    ]
    return JSONResponse(rows)
