"""Exposed ports, daemon side: `/v1/ports/{port}/<path>` relayed to 127.0.0.1:{port} in the cell.

The daemon runs in the cell's network namespace, so its 127.0.0.1 is the cell's own loopback:
whatever the code serves there is reachable, and nothing else. The request arrives signed like
every other (the router's JWT is checked, then dropped: the app never sees it), is sent with
`Connection: close`, and the response streams back as h11 decodes its framing. Imported on the
first relayed request only: the daemon's start path stays lean.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import h11
from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response, StreamingResponse
from starlette.websockets import WebSocket

from sandcell.errors import ErrorCode, ServiceError
from sandcell.http import hop
from sandcell.network import websocket as ws

CHUNK = 65_536
CONNECT_TIMEOUT_S = 5.0
RESPONSE_TIMEOUT_S = 120.0  # the router's own default read timeout


def target_port(request: HTTPConnection) -> int:
    text = request.path_params["port"]
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise ServiceError(ErrorCode.BAD_REQUEST, f"invalid port {text!r}", {"port": text})
    return int(text)


async def relay(request: Request, body: bytes) -> Response:
    port = target_port(request)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, limit=CHUNK), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        raise _unreachable(port, "nothing is listening") from exc
    conn = h11.Connection(h11.CLIENT)
    try:
        writer.write(_request_bytes(conn, request, port, body))
        head = await asyncio.wait_for(_response_head(conn, reader), RESPONSE_TIMEOUT_S)
    except (OSError, TimeoutError, h11.ProtocolError) as exc:
        writer.close()
        raise _unreachable(port, f"no valid HTTP answer ({type(exc).__name__})") from exc
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in hop.relayed(head.headers)}
    return StreamingResponse(
        _body(conn, reader),
        status_code=head.status_code,
        headers=headers,
        background=BackgroundTask(_close, writer.close),
    )


def _request_bytes(conn: h11.Connection, request: Request, port: int, body: bytes) -> bytes:
    rest = request.path_params.get("path", "")
    query = request.url.query
    target = "/" + rest + (f"?{query}" if query else "")
    headers = hop.forwarded(request.headers.raw)  # the daemon's token never reaches the app
    headers += [
        (b"host", f"127.0.0.1:{port}".encode()),
        (b"connection", b"close"),
        (b"content-length", str(len(body)).encode()),
    ]
    method = request.method.encode()
    out = conn.send(h11.Request(method=method, target=target.encode(), headers=headers)) or b""
    if body:
        out += conn.send(h11.Data(data=body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await reader.read(CHUNK))
    return event


async def _response_head(conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Response:
    while True:
        event = await _next(conn, reader)
        if isinstance(event, h11.Response):
            return event
        if not isinstance(event, h11.InformationalResponse):
            raise h11.RemoteProtocolError("the connection closed before a response")


async def _body(conn: h11.Connection, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    try:
        while isinstance(event := await _next(conn, reader), h11.Data):
            yield bytes(event.data)
    except (OSError, h11.ProtocolError):
        return  # the app broke off: the client sees a truncated body


async def _close(close: Callable[[], None]) -> None:
    with contextlib.suppress(OSError):
        close()


def _unreachable(port: int, why: str) -> ServiceError:
    return ServiceError(
        ErrorCode.SANDBOX_UNREACHABLE,
        f"port {port} in the sandbox: {why}",
        {"port": port},
    )


async def relay_websocket(websocket: WebSocket) -> None:
    """A WebSocket to 127.0.0.1:{port} in the cell; a refused upgrade (nothing listening, no
    WebSocket there) closes before accepting, which the caller sees as a failed handshake."""
    port = target_port(websocket)
    query = websocket.url.query
    target = "/" + websocket.path_params.get("path", "") + (f"?{query}" if query else "")
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, limit=CHUNK), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        await websocket.close(ws.BROKEN)
        return
    upstream = ws.Upstream(reader, writer)
    try:
        await upstream.handshake(
            f"127.0.0.1:{port}", target, subprotocols=ws.requested_subprotocols(websocket)
        )
    except ws.Rejected:
        upstream.close()
        await websocket.close(ws.BROKEN)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    await ws.relay(websocket, upstream)
