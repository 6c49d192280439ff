"""The daemon's HTTP/1.1 server: httptools parsing ASGI requests on the event loop.

What uvicorn did for the daemon, without what uvicorn imports at start (its CLI's click,
ssl, logging configuration: ~20 ms and ~2 MB of every cell). One connection runs one
request at a time; pipelined requests wait their turn. Request bodies are read as the app
asks (reading pauses past `BODY_HIGH_WATER` buffered bytes), responses are written with
the transport's backpressure, and nothing wakes up while idle: a keep-alive connection
holds one timer, the server none. WebSocket upgrades are handed, with the connection, to
uvicorn's WebSocket protocol, imported on the first one.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

import httptools

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

KEEP_ALIVE_S = 75.0
BODY_HIGH_WATER = 65_536
# Request line and headers; llhttp itself sets no bound.
MAX_HEAD_BYTES = 65_536
# Smaller bodies are joined with their framing into one write; larger ones are not copied.
COPY_BELOW = 65_536
_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 30\r\nconnection: close\r\n\r\nInvalid HTTP request received."
)
_NO_BODY_STATUSES = (204, 304)
log = logging.getLogger("sandcell.daemon")


class Server:
    """Serves `app` on listening sockets until `stop` is set (by a signal)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.connections: set[Connection] = set()
        self._websocket_factory: Callable[[], asyncio.Protocol] | None = None

    async def serve(self, sock: Any, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(lambda: Connection(self), sock=sock, backlog=1024)
        await stop.wait()
        listener.close()
        for connection in list(self.connections):
            connection.shutdown()
        while self.connections:  # requests under way finish, as uvicorn let them
            await asyncio.sleep(0.05)

    def websocket_protocol(self) -> asyncio.Protocol:
        if self._websocket_factory is None:
            self._websocket_factory = _uvicorn_websockets(self.app)
        return self._websocket_factory()


def _uvicorn_websockets(app: ASGIApp) -> Callable[[], asyncio.Protocol]:
    """uvicorn's WebSocket protocol, set up as uvicorn's server set it up for the daemon."""
    from uvicorn.config import Config
    from uvicorn.protocols.websockets.wsproto_impl import WSProtocol
    from uvicorn.server import ServerState

    config = Config(  # wsproto: the one WebSocket library, as on the router's side
        app, lifespan="off", proxy_headers=False, log_level="warning", ws="wsproto"
    )
    config.load()  # ws="wsproto": its ws_protocol_class is WSProtocol
    state = ServerState()
    return lambda: WSProtocol(config=config, server_state=state, app_state={})


class Connection(asyncio.Protocol):
    """One client connection: parses requests and runs one `Exchange` at a time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport
        self.exchange: Exchange | None = None  # the one whose request is being parsed
        self.active: Exchange | None = None  # the one the app is answering
        self.waiting: deque[Exchange] = deque()
        self.writable = asyncio.Event()
        self.writable.set()
        self.reading = True
        self._keep_alive: asyncio.TimerHandle | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._upgrade = False

    # -- transport events ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.server.connections.add(self)
        self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self._cancel_keep_alive()
        for exchange in (self.active, self.exchange, *self.waiting):
            if exchange is not None:
                exchange.disconnected = True
                exchange.message.set()
        self.writable.set()
        active = self.active
        if active is not None and active.started and not active.done and active.task:
            # A stream waiting for its next piece (a follow, a quiet command) would not
            # learn of it before it sends: stopped now, as Starlette's watcher did.
            active.task.cancel()

    def data_received(self, data: bytes) -> None:
        self._cancel_keep_alive()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._upgrade:
                self._hand_over_websocket()
        except httptools.HttpParserError:
            self._bad_request()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def shutdown(self) -> None:
        """Stopping: an idle connection closes now, a busy one after its response."""
        if self.active is None:
            self.transport.close()
        else:
            self.active.keep_alive = False

    # -- parser callbacks (httptools) --------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url, self._headers, self._head_bytes, self._upgrade = b"", [], 0, False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._count_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and self._upgrade_is_websocket():
            self._upgrade = True
            return
        exchange = Exchange(self, self._scope(), self.parser.should_keep_alive())
        self.exchange = exchange
        if self.active is None:
            self._start(exchange)
        else:  # pipelined: answered in order, reading waits meanwhile
            self.waiting.append(exchange)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.done or exchange.disconnected:
            return
        exchange.body += body
        if len(exchange.body) > BODY_HIGH_WATER:
            self.pause_reading()
        exchange.message.set()

    def on_message_complete(self) -> None:
        if (exchange := self.exchange) is not None:
            exchange.more_body = False
            exchange.message.set()

    # -- helpers -----------------------------------------------------------------------------

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("request head too large")

    def _upgrade_is_websocket(self) -> bool:
        return any(n == b"upgrade" and v.lower() == b"websocket" for n, v in self._headers)

    def _scope(self) -> Scope:
        url = httptools.parse_url(self._url)
        raw_path = url.path or b"/"
        path = raw_path.decode("ascii", "replace")
        return {
            "type": "http",
            # 2.4: `send` raises once the client is gone, so Starlette streams without an
            # anyio task group watching for the disconnect (see `connection_lost`).
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": self.parser.get_http_version(),
            "server": None,
            "client": None,
            "scheme": "http",
            "method": self.parser.get_method().decode("ascii"),
            "root_path": "",
            "path": unquote(path) if "%" in path else path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
        }

    def _start(self, exchange: Exchange) -> None:
        self.active = exchange
        exchange.task = self.loop.create_task(exchange.run(self.server.app))

    def finished(self, exchange: Exchange) -> None:
        """The response is complete: the next pipelined request, or an idle connection."""
        if not exchange.keep_alive:
            self.transport.close()
            return
        self.active = None
        self.resume_reading()
        if self.waiting:
            self._start(self.waiting.popleft())
        elif not self.transport.is_closing():
            self._idle()

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.reading and not self.transport.is_closing():
            self.reading = True
            self.transport.resume_reading()

    def _idle(self) -> None:
        self._keep_alive = self.loop.call_later(KEEP_ALIVE_S, self._idle_too_long)

    def _idle_too_long(self) -> None:
        if self.active is None:
            self.transport.close()

    def _cancel_keep_alive(self) -> None:
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None

    def _bad_request(self) -> None:
        if self.active is None or not self.active.started:  # not in the middle of an answer
            self.transport.write(_BAD_REQUEST)
        self.transport.close()  # the app's answer, if it comes, is dropped

    def _hand_over_websocket(self) -> None:
        self.server.connections.discard(self)
        self._cancel_keep_alive()
        head = [self.parser.get_method(), b" ", self._url, b" HTTP/1.1\r\n"]
        for name, value in self._headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        protocol = self.server.websocket_protocol()
        protocol.connection_made(self.transport)
        protocol.data_received(b"".join(head))  # type: ignore[attr-defined]
        self.transport.set_protocol(protocol)


class ClientDisconnected(OSError):
    """What `send` raises once the client is gone (ASGI 2.4)."""


class Exchange:
    """One request and its response, as the ASGI app sees them."""

    def __init__(self, connection: Connection, scope: Scope, keep_alive: bool) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.body = b""
        self.more_body = True
        self.message = asyncio.Event()
        self.disconnected = False
        self.task: asyncio.Task[None] | None = None
        self.started = False
        self.done = False
        self.chunked = False
        self.remaining: int | None = None  # of a declared Content-Length
        self._head = b""
        self._head_flush: asyncio.Handle | None = None
        self.expects_continue = any(
            n == b"expect" and v.lower() == b"100-continue" for n, v in scope["headers"]
        )

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            if not self.disconnected:
                raise
        except Exception:
            if self.disconnected:  # the client left: what failed after that is no bug
                return
            log.exception("unhandled error in the daemon's app")
            if not self.started:
                self.keep_alive = False
                await self._internal_error()
        if not self.done and not self.disconnected:  # the app returned mid-response
            self.connection.transport.close()

    async def _internal_error(self) -> None:
        body = b"Internal Server Error"
        await self.send({"type": "http.response.start", "status": 500, "headers": []})
        await self.send({"type": "http.response.body", "body": body})

    async def receive(self) -> Message:
        if self.expects_continue and not self.started and not self.disconnected:
            self.expects_continue = False
            self.connection.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.disconnected and not self.done:
            self.connection.resume_reading()
            await self.message.wait()
            self.message.clear()
        if self.disconnected or self.done:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": self.body, "more_body": self.more_body}
        self.body = b""
        return message

    async def send(self, message: Message) -> None:
        if not self.connection.writable.is_set():  # the client reads slower than we write
            await self.connection.writable.wait()
        if self.disconnected or self.connection.transport.is_closing():
            raise ClientDisconnected("the client is gone")
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']}")
            self._start(message["status"], message.get("headers", ()))
        elif not self.done:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']}")
            self._write(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError("the response is complete")

    def _start(self, status: int, headers: Any) -> None:
        self.started = True
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status))]
        for raw_name, value in headers:
            name = raw_name.lower()
            if b"\r" in name + value or b"\n" in name + value:
                raise RuntimeError("invalid response header")
            if name == b"content-length":
                self.remaining = int(value)
            elif name == b"connection" and value.lower() == b"close":
                self.keep_alive = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.chunked = True
            head += [name, b": ", value, b"\r\n"]
        bodiless = self.scope["method"] == "HEAD" or status in _NO_BODY_STATUSES
        if bodiless:
            self.remaining, self.chunked = 0, False
        elif self.remaining is None and not self.chunked:
            self.chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        # Sent with the first body piece, usually in the same step: one write, one wake-up
        # of the client; or on its own at the loop's next turn if the body takes longer.
        self._head = b"".join(head)
        self._head_flush = self.connection.loop.call_soon(self._flush_head)

    def _flush_head(self) -> None:
        if not self.connection.transport.is_closing():
            self.connection.transport.write(self._head)
        self._head = b""

    def _write(self, body: bytes, more_body: bool) -> None:
        if self._head_flush is not None:
            self._head_flush.cancel()
            self._head_flush = None
        pieces = [self._head] if self._head else []
        self._head = b""
        if self.chunked:
            if body:
                pieces += [b"%x\r\n" % len(body), body, b"\r\n"]
            if not more_body:
                pieces.append(b"0\r\n\r\n")
        elif self.remaining is not None and self.scope["method"] != "HEAD":
            if len(body) > self.remaining:
                raise RuntimeError("response longer than its Content-Length")
            self.remaining -= len(body)
            pieces.append(body)
        if len(body) < COPY_BELOW:
            self.connection.transport.write(b"".join(pieces))
        else:  # no copy of a large body
            self.connection.transport.writelines(pieces)
        if more_body:
            return
        if self.remaining and not self.chunked:
            raise RuntimeError("response shorter than its Content-Length")
        self.done = True
        self.message.set()  # a receive() waiting for a disconnect learns it is over
        self.connection.finished(self)


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
