"""A streamed response that stops when its client goes, at the cost of one watcher task.

Starlette's StreamingResponse (under uvicorn's ASGI 2.3) runs each response in an anyio task
group with a cancel scope, a task for the stream and one listening for the disconnect: on
a short stream (an E2B command's start and end) that set-up is a visible part of the call.
Here the stream runs in the request's own task and a watcher cancels it when the client
disconnects, as the task group would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

_CLIENT_GONE = "sandcell: the client disconnected"


class Streamed(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None  # an ASGI app runs in a task
        watcher = asyncio.ensure_future(
            on_disconnect(receive, lambda: streaming.cancel(_CLIENT_GONE))
        )
        try:
            await self.stream_response(send)
        except asyncio.CancelledError as exc:
            if not (watcher.done() and exc.args == (_CLIENT_GONE,)):
                raise  # a cancel of the request itself (the server stopping)
            streaming.uncancel()
        finally:
            watcher.cancel()
        if self.background is not None:
            await self.background()


async def on_disconnect(receive: Receive, then: Callable[[], object]) -> None:
    """Calls `then` once the client has gone (router.proxy's relay closes its daemon answer)."""
    while (await receive())["type"] != "http.disconnect":
        pass  # the rest of a request body the stream did not read
    then()
