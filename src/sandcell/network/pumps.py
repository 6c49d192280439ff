"""Running the two directions of a relay together (stdlib only: the daemon imports it)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def both_ways(
    there: Coroutine[Any, Any, None], back: Coroutine[Any, Any, None], *, until_first: str
) -> None:
    """Runs both directions until `until_first` (asyncio.FIRST_COMPLETED or
    FIRST_EXCEPTION) happens, then stops the other; nothing is left running or unretrieved,
    cancellation of the caller included."""
    pumps = [asyncio.ensure_future(there), asyncio.ensure_future(back)]
    try:
        await asyncio.wait(pumps, return_when=until_first)
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
