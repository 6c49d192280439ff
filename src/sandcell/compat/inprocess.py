"""Plumbing of the façades' in-process calls into the router: a request as the router's
handlers expect one, a response's body read back (streamed or not), and a daemon's error
turned back into the same `SandcellError`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive

from sandcell.errors import ErrorCode, SandcellError


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


def request(
    app: ASGIApp,
    method: str,
    path: str,
    *,
    body: bytes | Request = b"",
    query: dict[str, Any] | str | None = None,
    headers: dict[str, str] | None = None,
    path_params: dict[str, str] | None = None,
    client: str = "127.0.0.1",
) -> Request:
    """A Request as the router's handlers expect one, with `body` as its whole body, or read
    on from `body`'s own stream when it is the caller's request (an upload, not buffered);
    `query` is a mapping or an already-encoded string; `client` is its peer (the router's
    failed-key brake counts by address)."""
    fields = dict(headers or {})
    if isinstance(body, Request):
        receive = body.receive
        if (length := body.headers.get("content-length")) is not None:
            fields["content-length"] = length
    else:
        receive = whole_body(body)
        fields["content-length"] = str(len(body))
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": quote(path).encode(),
        "query_string": (query if isinstance(query, str) else urlencode(query or {})).encode(),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in fields.items()],
        "client": (client, 0),
        "server": ("127.0.0.1", 0),
        "app": app,
        "path_params": path_params or {},
    }
    return Request(scope, receive)


def daemon_error(status: int, data: bytes) -> SandcellError:
    """The daemon's SPEC §1 error as the same SandcellError, so each façade maps it once; a
    body that is not one means the sandbox misbehaved, not the router."""
    try:
        error = json.loads(data)["error"]
        return SandcellError(ErrorCode(error["code"]), str(error["message"]), error.get("details"))
    except (ValueError, KeyError, TypeError):
        return SandcellError(ErrorCode.SANDBOX_UNREACHABLE, f"the sandbox answered {status}")
