"""NDJSON responses: events as a task produces them, then the one it ends with."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

Event = dict[str, Any]
Emit = Callable[[Event], None]


def line(obj: Any) -> bytes:
    """One line, ASCII-only: no byte of the data can split or corrupt the stream."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


async def event_stream(run: Callable[[Emit], Awaitable[Event]]) -> AsyncIterator[bytes]:
    """Runs `run(emit)` in a task; yields each emitted event as it comes, then its result.

    If the client goes away, the task is cancelled (whoever runs it cleans up)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    task = asyncio.ensure_future(run(lambda event: queue.put_nowait(line(event))))
    try:
        while not (task.done() and queue.empty()):
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        yield line(task.result())
    finally:
        task.cancel()
