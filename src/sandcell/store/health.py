"""Tells the operator when the store stops answering and when it is back: once each, however
many requests fail meanwhile."""

from __future__ import annotations

import asyncio
import logging
import time

from .base import Store

log = logging.getLogger("sandcell.store")
WATCH_INTERVAL_S = 2.0


async def watch(store: Store, interval_s: float = WATCH_INTERVAL_S) -> None:
    """Pings the store every `interval_s` until cancelled, logging each change of state."""
    down_since: float | None = None
    while True:
        try:
            async with asyncio.timeout(interval_s):
                await store.ping()
        except Exception as exc:  # any failure to answer is "unreachable" to the operator
            if down_since is None:
                down_since = time.monotonic()
                log.error(  # noqa: TRY400 (one line for the operator, not a traceback)
                    "store unreachable (%s: %s); requests that need it get 503 until it is back",
                    type(exc).__name__,
                    exc or "no answer",
                )
        else:
            if down_since is not None:
                outage = round(time.monotonic() - down_since, 1)
                log.warning(
                    "store reachable again after %.1f s", outage, extra={"outage_s": outage}
                )
                down_since = None
        await asyncio.sleep(interval_s)
