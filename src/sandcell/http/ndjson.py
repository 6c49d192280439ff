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


async def relay(
    task: asyncio.Future[Event],
    next_event: Callable[[], Awaitable[Event]],
    pending: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """Yields the events `next_event` hands out while `task` runs or `pending()` says more
    are waiting, then the task's result. If the client goes away, the task is cancelled
    (whoever runs it cleans up)."""
    try:
        while not (task.done() and not pending()):
            getter = asyncio.ensure_future(next_event())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield line(getter.result())
            else:
                getter.cancel()
        yield line(task.result())
    finally:
        task.cancel()


def event_stream(run: Callable[[Emit], Awaitable[Event]]) -> AsyncIterator[bytes]:
    """Runs `run(emit)` in a task; each emitted event streams as it comes, then its result.
    For producers whose output is bounded already (the queue is not)."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    task = asyncio.ensure_future(run(queue.put_nowait))
    return relay(task, queue.get, lambda: not queue.empty())
