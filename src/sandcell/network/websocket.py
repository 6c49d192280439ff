"""WebSocket relays for exposed ports: router -> daemon -> the app in the cell.

Each hop serves an ASGI WebSocket on one side and is a WebSocket client (wsproto, sans-I/O, on
asyncio streams) on the other. Messages are relayed whole, each bounded, both ways, until one
side closes; pings are answered per hop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from starlette.websockets import WebSocket, WebSocketDisconnect
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from sandcell.network.pumps import both_ways

CHUNK = 65_536
MAX_MESSAGE = 16 * 1_048_576
HANDSHAKE_TIMEOUT_S = 10.0
GOING_AWAY, TOO_BIG, BROKEN = 1001, 1009, 1011


MAX_REJECTION_BODY = 65_536


class Rejected(Exception):
    """The upstream refused the WebSocket handshake (or spoke no WebSocket): its HTTP
    answer, when it gave one (status 502 when it gave none)."""

    def __init__(
        self, why: str, status: int = 502, body: bytes = b"", media_type: str | None = None
    ) -> None:
        super().__init__(why)
        self.status = status
        self.body = body
        self.media_type = media_type


class Upstream:
    """A client WebSocket over an open stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ws = WSConnection(ConnectionType.CLIENT)
        self._pending: deque[Event] = deque()
        self.subprotocol: str | None = None

    async def handshake(
        self,
        host: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
        subprotocols: Sequence[str] = (),
    ) -> None:
        self.send(
            Request(
                host=host,
                target=target,
                extra_headers=list(headers),
                subprotocols=list(subprotocols),
            )
        )
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                event = await self.next_event()
                if isinstance(event, RejectConnection):
                    raise await self._rejection(event)
        except (TimeoutError, RemoteProtocolError, OSError) as exc:
            raise Rejected(f"no WebSocket handshake: {exc}") from exc
        if not isinstance(event, AcceptConnection):
            raise Rejected("the upstream spoke no WebSocket")
        self.subprotocol = event.subprotocol

    async def _rejection(self, event: RejectConnection) -> Rejected:
        """The refusal with its body (bounded), so the caller can pass the answer on."""
        media_type = dict(event.headers).get(b"content-type", b"").decode("latin-1") or None
        body = b""
        while event.has_body and len(body) <= MAX_REJECTION_BODY:
            part = await self.next_event()
            if not isinstance(part, RejectData):
                break
            body += part.data
            if part.body_finished:
                break
        why = f"the WebSocket handshake was refused (HTTP {event.status_code})"
        return Rejected(why, event.status_code, body[:MAX_REJECTION_BODY], media_type)

    def send(self, event: Event) -> None:
        self.writer.write(self.ws.send(event))

    async def next_event(self) -> Event | None:
        """The next event, or None once the stream has ended."""
        while not self._pending:
            data = await self.reader.read(CHUNK)
            self.ws.receive_data(data or None)
            self._pending.extend(self.ws.events())
            if not data and not self._pending:
                return None
        return self._pending.popleft()

    def close(self) -> None:
        self.writer.close()


async def _nothing() -> None:
    return None


async def relay(
    websocket: WebSocket, upstream: Upstream, seen: Callable[[], Awaitable[None]] = _nothing
) -> None:
    """Both directions until either side closes; then the other is closed too. `seen` is
    awaited on each message, either way (the sandbox's activity)."""
    try:
        await both_ways(
            _client_to_upstream(websocket, upstream, seen),
            _upstream_to_client(websocket, upstream, seen),
            until_first=asyncio.FIRST_COMPLETED,
        )
    finally:
        upstream.close()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(GOING_AWAY)  # already closed: nothing to do


async def _client_to_upstream(
    websocket: WebSocket, upstream: Upstream, seen: Callable[[], Awaitable[None]]
) -> None:
    while True:
        message = await websocket.receive()
        await seen()
        if message["type"] == "websocket.disconnect":
            with contextlib.suppress(LocalProtocolError):
                upstream.send(CloseConnection(code=message.get("code") or 1000))
            return
        if message.get("text") is not None:
            upstream.send(TextMessage(data=message["text"]))
        elif message.get("bytes") is not None:
            upstream.send(BytesMessage(data=message["bytes"]))
        await upstream.writer.drain()


async def _upstream_to_client(
    websocket: WebSocket, upstream: Upstream, seen: Callable[[], Awaitable[None]]
) -> None:
    parts: list[str | bytes] = []
    size = 0
    while (event := await upstream.next_event()) is not None:
        if isinstance(event, Ping):
            upstream.send(event.response())
        elif isinstance(event, CloseConnection):
            with contextlib.suppress(LocalProtocolError):
                upstream.send(event.response())
            await websocket.close(event.code)
            return
        elif isinstance(event, TextMessage | BytesMessage):
            parts.append(event.data if isinstance(event.data, str) else bytes(event.data))
            size += len(event.data)
            if size > MAX_MESSAGE:
                await websocket.close(TOO_BIG)
                return
            if event.message_finished:
                await seen()
                await _deliver(websocket, parts)
                parts, size = [], 0
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close(BROKEN)  # the upstream went away without a close frame


async def _deliver(websocket: WebSocket, parts: list[str | bytes]) -> None:
    if isinstance(parts[0], str):
        await websocket.send_text("".join(p for p in parts if isinstance(p, str)))
    else:
        await websocket.send_bytes(b"".join(p for p in parts if isinstance(p, bytes)))


def requested_subprotocols(websocket: WebSocket) -> list[str]:
    header = websocket.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]
