"""Plumbing of the façades' in-process calls into the router: a request's whole body as an
ASGI receive channel, and a response's body read back, whether it streamed or not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive


def whole_body(body: bytes) -> Receive:
    """An ASGI receive channel that hands over `body` in one message, then a disconnect."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def body_chunks(response: Response) -> AsyncIterator[bytes]:
    """The response's body, streamed or not; closes what the response holds open."""
    try:
        if isinstance(response, StreamingResponse):
            async for chunk in response.body_iterator:
                yield chunk if isinstance(chunk, bytes) else chunk.encode()
        else:
            yield bytes(response.body)
    finally:
        if response.background is not None:
            await response.background()


async def read_all(response: Response) -> bytes:
    return b"".join([chunk async for chunk in body_chunks(response)])


async def read_json(response: Response) -> Any:
    data = await read_all(response)
    return json.loads(data) if data else None
