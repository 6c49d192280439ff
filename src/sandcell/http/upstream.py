"""A lean HTTP/1.1 client for the router's hop to a sandbox's daemon.

The router's hop to a daemon is one small request and one small answer most of the time;
httpx spent more CPU on it than the daemon did (its request head and body left in two sends,
each waking the daemon, plus anyio's cancel scopes around every read). Here a request leaves
in one write, the answer is parsed by httptools as it arrives, and connections are kept per
daemon in a small pool.

The server runs inside a sandbox, so its answer is treated as hostile: a head larger than
`MAX_HEAD_BYTES`, bytes no HTTP parser accepts, an interim (1xx) answer or anything sent when
no request is out end the connection with an `UpstreamError`; so does silence longer than
the caller's timeout (`UpstreamTimeout`). A body that stops early ends in an error too, never
in a wait that outlives the timeout.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import httptools

MAX_HEAD_BYTES = 64 * 1024
# Body bytes parsed ahead of the reader before the socket stops being read.
HIGH_WATER = 1 << 20
LOW_WATER = HIGH_WATER // 4
# A relayed chunk joins the pieces that arrived together, up to this size.
MAX_CHUNK = 1 << 20
MAX_IDLE_PER_POOL = 16
IDLE_S = 30.0  # well below a daemon's keep-alive (75 s): it never closes a socket we reuse
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")

Headers = list[tuple[bytes, bytes]]
Dial = Callable[[Callable[[], asyncio.Protocol]], Awaitable[tuple[Any, Any]]]


class UpstreamError(Exception):
    """The server could not be reached, closed early or answered something that is not
    HTTP/1.1 within the bounds above."""


class UpstreamTimeout(UpstreamError):
    """The server was silent longer than the request allows."""


def request_head(method: str, target: bytes, host: bytes, headers: Headers) -> bytes:
    """The request line and header block; refuses (ValueError) what would split the head."""
    if _BAD_TARGET.search(target) or not _TOKEN.fullmatch(method.encode()):
        raise ValueError("invalid request target or method")
    parts = [method.encode(), b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise ValueError("invalid header")
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.closed = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: Headers = []
        self._busy = False
        self._head_bytes = 0  # as received
        self._parsed_head = 0  # as parsed, header by header
        self._head_done = False
        self.complete = False
        self._keep_alive = False
        self._request_sent = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._reading_paused = False
        self._writing_paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self._busy or self.complete:
            self._fail(UpstreamError("the server sent bytes no request asked for"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # what a callback below raised
            self._fail(cause if isinstance(cause, UpstreamError) else UpstreamError(f"{exc}"))
            return
        if not self._head_done:
            # Counted here as well as by the parser: it buffers a header line whole.
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(UpstreamError("the response head is too large"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        if self._busy and not self.complete:
            if self._head_done and self._until_close():
                self.complete = True  # a body delimited by the close, now whole
            elif self._error is None:
                self._error = UpstreamError("the server closed the connection mid-response")
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            raise UpstreamError("the server sent a second response")

    def on_header(self, name: bytes, value: bytes) -> None:
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise UpstreamError("the response carries an invalid header")
        self._parsed_head += len(name) + len(value) + 4
        if self._parsed_head > MAX_HEAD_BYTES:  # a whole head may arrive in one read
            raise UpstreamError("the response head is too large")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.status < 200:
            raise UpstreamError(f"unexpected interim response {self.status}")
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._keep_alive = self._parser.should_keep_alive()  # reset once the callback returns
        self._wake()

    # -- the exchange ------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Head and body of a buffered request, in one write."""
        self._busy = True
        self.transport.write(data)
        self._request_sent = True

    async def send_stream(
        self, head: bytes, body: AsyncIterable[bytes], chunked: bool, timeout: float | None
    ) -> None:
        """A request whose body is read on from `body` as it is sent (with chunked framing
        when no length was declared). Stops early if the server answers meanwhile."""
        self._busy = True
        self.transport.write(head)
        async for chunk in body:
            if self._head_done or self.closed:
                return  # answered (or gone) before the whole body: the answer stands
            if chunk:
                self.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            while self._writing_paused and not self.closed:
                await self._wait(timeout)
        if chunked and not self.closed:
            self.transport.write(b"0\r\n\r\n")
        self._request_sent = True

    async def response_head(self, timeout: float | None) -> None:
        """Waits for the head; `timeout` bounds the whole wait, so a server trickling its
        head byte by byte cannot hold the request longer."""
        await self._until(lambda: self._head_done, timeout)

    async def whole_if_within(self, limit: int, grace: float) -> None:
        """Waits up to `grace` for the rest of a body declared no longer than `limit` (a
        server may write head and body apart: the answer then still goes on in one piece).
        A body slower than that is left to be read on as it comes."""
        length = self.content_length()
        if length is None or length > limit:
            return
        deadline = self.loop.time() + grace
        while not self.complete and (left := deadline - self.loop.time()) > 0:
            self._raise_if_failed()
            await self._wait(left, self._wake)

    def content_length(self) -> int | None:
        for name, value in self.headers:
            if name == b"content-length":
                return int(value) if value.isdigit() else None
        return None

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The body bytes that have arrived (joined up to `MAX_CHUNK`), or None at its end."""
        while not self._chunks:
            if self.complete:
                return None
            self._raise_if_failed()
            await self._wait(timeout)
        parts = [self._chunks.popleft()]
        size = len(parts[0])
        while self._chunks and size + len(self._chunks[0]) <= MAX_CHUNK:
            parts.append(self._chunks.popleft())
            size += len(parts[-1])
        chunk = parts[0] if len(parts) == 1 else b"".join(parts)
        self._buffered -= size
        if self._reading_paused and self._buffered < LOW_WATER and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    def body(self) -> bytes:
        """The whole body of a complete response."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    @property
    def reusable(self) -> bool:
        return (
            self.complete
            and self._request_sent
            and not self.closed
            and not self._chunks
            and self._keep_alive
        )

    def close(self) -> None:
        self._cancel_idle()
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = True

    # -- helpers -----------------------------------------------------------------------------

    def _until_close(self) -> bool:
        """Whether the body has no framing of its own and so ends when the server closes."""
        framed = {b"content-length", b"transfer-encoding"}
        return not any(name in framed for name, _ in self.headers)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
        if self.closed:
            raise UpstreamError("the connection is closed")

    async def _until(self, done: Callable[[], bool], timeout: float | None) -> None:
        deadline = None if timeout is None else self.loop.time() + timeout
        while not done():
            self._raise_if_failed()
            await self._wait(None if deadline is None else deadline - self.loop.time())

    async def _wait(self, timeout: float | None, then: Callable[[], None] | None = None) -> None:
        """Until woken, or `timeout` passes: then `then` (by default, fail as timed out)."""
        self._waiter = self.loop.create_future()
        on_timeout = then or self._time_out
        timer = None if timeout is None else self.loop.call_later(timeout, on_timeout)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _time_out(self) -> None:
        self._fail(UpstreamTimeout("the server did not answer in time"))

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self.close()
        self._wake()

    def park(self, idle_s: float) -> None:
        """Ready for the next exchange; closes itself after `idle_s` unused."""
        self._reset()
        self._idle_timer = self.loop.call_later(idle_s, self.close)

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def unpark(self) -> None:
        self._cancel_idle()


class Pool:
    """Keep-alive connections to one server: at most `max_idle` kept between requests, each
    for at most `idle_s`; as many open at once as requests are in flight."""

    def __init__(
        self, dial: Dial, max_idle: int = MAX_IDLE_PER_POOL, idle_s: float = IDLE_S
    ) -> None:
        self._dial = dial
        self._idle: list[Connection] = []
        self.max_idle = max_idle
        self.idle_s = idle_s
        self.closed = False

    async def acquire(self, connect_timeout: float) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            conn.unpark()
            if not conn.closed:
                return conn
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await self._dial(lambda: Connection(self))
        except TimeoutError as exc:
            raise UpstreamTimeout("the server did not accept a connection in time") from exc
        except OSError as exc:
            raise UpstreamError(f"cannot connect: {exc}") from exc
        return conn

    def release(self, conn: Connection) -> None:
        """Back to the pool if the exchange ended cleanly, else closed."""
        if conn.reusable and not self.closed and len(self._idle) < self.max_idle:
            conn.park(self.idle_s)
            self._idle.append(conn)
        else:
            conn.close()

    def discard(self, conn: Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        """Closes the idle connections; those in use close when released."""
        self.closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
