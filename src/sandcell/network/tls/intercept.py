"""The HTTP/1.1 relay for a CONNECT towards a host that one of the sandbox's secrets names.

The proxy verifies the real server first (its own TLS connection, `upstream`), then answers the
CONNECT and terminates the cell's TLS with a leaf for the host signed by the sandbox's CA (ALPN
`http/1.1` only). h11 frames both sides: each request's head gets its placeholders substituted
(`HostRules.head`), its body streams through a `Rewriter` (re-chunked by h11 when chunked; with a
`Content-Length` that substitution changes, read whole first, within `MAX_REWRITTEN_BODY`, so the
length sent is right), and each response streams back with any echo of a value replaced by its
placeholder; a response whose length that could change is read whole up to `MAX_REFRAMED`
and sent with its new length, a longer one is sent chunked. A refused placeholder
never reaches the upstream: in the head it stops the request before anything is sent; in a
streamed body the chunk that holds it is never sent (the upstream gets an incomplete request
and the connection closes). Either way the cell gets a 403 naming the secret and the host.

Bulk bodies: each TLS transport decrypts into a fixed buffer of its own (`_Inbox`, read up to
`CHUNK` at a time), h11 frames what it holds, the rewrite hands back views of the chunk where
nothing matches, and h11's framing pieces go out in one `writelines`: a body byte is copied
by h11 and the TLS layers only, and Python runs once per chunk, not per record.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, cast

import h11

from sandcell.network.policy import Decision
from sandcell.network.tls.rewrite import HostRules, Refusal, Rewriter
from sandcell.network.tls.substitution import Substitution

if TYPE_CHECKING:
    from sandcell.network.egress import EgressService

log = logging.getLogger("sandcell.egress.secrets")
CHUNK = 262_144  # what one read may bring: big enough that per-read costs do not count
MAX_HEAD = 65_536
SMALL = 16_384  # what is joined before it is sent (a TLS record's worth): larger goes as is
MAX_REWRITTEN_BODY = 16 * 1_048_576
# A response whose length an echo could change is read whole up to this size (its length
# stays known to the client); a longer one is sent chunked.
MAX_REFRAMED = 1_048_576
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
# Framing is h11's to set on the way out: these come from the other side's framing.
FRAMING = {b"content-length", b"transfer-encoding"}


class _Inbox(asyncio.BufferedProtocol):
    """A TLS transport's protocol in place of its StreamReader's: records are decrypted
    straight into one buffer of `CHUNK` bytes (no bytes object per record, no copies into and
    out of a stream buffer), reading pauses while it is full, and writes have `drain`."""

    def __init__(self, transport: asyncio.Transport, closed: bool) -> None:
        self.transport = transport
        self.buffer = memoryview(bytearray(CHUNK))
        self.filled = 0
        self.eof = closed
        self.lost = False
        self.error: BaseException | None = None
        self.paused = False
        self.reading: asyncio.Future[None] | None = None
        self.writing: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    async def install(cls, streams: Streams) -> _Inbox:
        """Takes `streams`' transport over from its StreamReader, with what it held."""
        reader, writer = streams
        # A TLS transport reads and writes (uvloop's is no subclass of asyncio's classes).
        transport = cast(asyncio.Transport, writer.transport)
        transport.set_protocol(inbox := cls(transport, transport.is_closing()))
        reader.feed_eof()  # it gets nothing more: what it holds is read without waiting
        if leftover := await reader.read():
            inbox.buffer = memoryview(bytearray(max(CHUNK, len(leftover) + 1)))
            inbox.buffer[: len(leftover)] = leftover
            inbox.filled = len(leftover)
        transport.resume_reading()  # its StreamReader may have paused it, when full
        return inbox

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer[self.filled :]  # never empty: reading pauses when it is full

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.buffer):
            self.paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = self.lost = True
        self.error = exc
        self._wake_reader()
        if self.writing is not None and not self.writing.done():
            self.writing.set_result(None)

    def pause_writing(self) -> None:
        if self.writing is None or self.writing.done():
            self.writing = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writing is not None and not self.writing.done():
            self.writing.set_result(None)
        self.writing = None

    def _wake_reader(self) -> None:
        if self.reading is not None and not self.reading.done():
            self.reading.set_result(None)

    async def wait(self, idle_s: float, last: list[float]) -> memoryview:
        """What has arrived (empty at the end), valid until `consumed`; an idle timeout
        only once `last` (both directions' last activity) is `idle_s` old."""
        while not self.filled:
            if self.error is not None:
                raise self.error
            if self.eof:
                return self.buffer[:0]
            self.reading = asyncio.get_running_loop().create_future()
            self._arm(idle_s, last)
            try:
                await self.reading
            finally:
                self.reading = None
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
        return self.buffer[: self.filled]

    def _arm(self, idle_s: float, last: list[float]) -> None:
        """A timer for when `last` will be `idle_s` old (cheaper per read than wait_for)."""
        due = max(0.0, idle_s - (time.monotonic() - last[0]))
        self.timer = asyncio.get_running_loop().call_later(due, self._idle, idle_s, last)

    def _idle(self, idle_s: float, last: list[float]) -> None:
        if self.reading is None or self.reading.done():
            return
        if time.monotonic() - last[0] >= idle_s:
            self.reading.set_exception(TimeoutError())
        else:  # the other direction was busy meanwhile
            self._arm(idle_s, last)

    def consumed(self) -> None:
        self.filled = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        if self.writing is not None:
            await self.writing
        if self.lost:
            raise ConnectionResetError("Connection lost")


Piece = bytes | bytearray | memoryview


class _Side:
    """One h11 connection over one TLS transport; `last` is shared by both sides, so a
    quiet side of a busy exchange does not time out."""

    def __init__(
        self,
        role: type[h11.CLIENT] | type[h11.SERVER],
        inbox: _Inbox,
        idle_s: float,
        last: list[float],
        count: Callable[[int], None],
    ) -> None:
        self.conn = h11.Connection(role, max_incomplete_event_size=MAX_HEAD)
        self.inbox = inbox
        self.transport = inbox.transport
        self.idle_s, self.last, self.count = idle_s, last, count
        self.pending: list[Piece] = []

    async def next_event(self) -> object:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.inbox.wait(self.idle_s, self.last)
            self.last[0] = time.monotonic()
            self.conn.receive_data(cast(bytes, data))  # h11 copies it: the buffer is free again
            self.inbox.consumed()

    async def send(self, event: h11.Event, *, now: bool = True) -> None:
        """Sends `event`; a head sent with `now=False` leaves with what follows it, in one
        write (one TCP segment: no small write for Nagle's algorithm to hold)."""
        self.pending += self.conn.send_with_data_passthrough(event) or []
        if now:
            await self.flush()

    async def send_body(self, pieces: list[Piece]) -> None:
        """Body bytes as they are (views of a bulk chunk are framed by h11, not copied)."""
        for piece in pieces:  # h11 takes any buffer, though typed for bytes
            data = h11.Data(data=cast(bytes, piece))
            self.pending += self.conn.send_with_data_passthrough(data) or []
        await self.flush()

    async def flush(self) -> None:
        if not self.pending:
            return
        out, self.pending = self.pending, []
        size = sum(map(len, out))
        self.count(size)
        if len(out) > 1 and size <= SMALL:
            out = [b"".join(out)]  # a head and a small body: one TLS record, not several
        self.transport.writelines(out)
        await self.inbox.drain()


async def relay(
    service: EgressService,
    substitution: Substitution,
    sandbox_id: str,
    rules: HostRules,
    decision: Decision,
    port: int,
    cell: Streams,
    established: Callable[[], Awaitable[None]],
    refuse: Callable[[int, str], Awaitable[None]],
    early: bytes = b"",
) -> None:
    """Serves one intercepted CONNECT: `established` answers it (HTTP 200 or SOCKS success),
    `refuse` answers it with a failure (the upstream could not be verified, say)."""
    from sandcell.network.egress import Refused

    try:
        upstream = await service.connect(
            decision, port, tls=substitution.upstream, server_hostname=rules.host
        )
    except Refused as exc:
        await refuse(502, exc.reason)
        return
    try:
        if early:  # the client spoke before the CONNECT's answer: not a TLS client
            await refuse(400, "the TLS handshake must follow the CONNECT's answer")
            return
        hosts = {h for b in rules.own for h in b.hosts}
        context = substitution.authorities.of(sandbox_id, hosts).server_context(rules.host)
        await established()
        await cell[1].start_tls(context, ssl_handshake_timeout=service.limits.head_timeout_s)
        cell_inbox, upstream_inbox = await _Inbox.install(cell), await _Inbox.install(upstream)
        last = [time.monotonic()]
        bytes_out = service.metrics.bytes.labels("out")
        bytes_in = service.metrics.bytes.labels("in")
        idle = service.limits.idle_timeout_s
        exchange = _Exchange(
            substitution,
            sandbox_id,
            rules,
            _Side(h11.SERVER, cell_inbox, idle, last, bytes_in.inc),
            _Side(h11.CLIENT, upstream_inbox, idle, last, bytes_out.inc),
        )
        await exchange.run()
    except (ssl.SSLError, h11.ProtocolError) as exc:
        log.info(
            "egress sandbox=%s host=%s: intercepted connection ended: %s",
            sandbox_id,
            rules.host,
            exc,
        )
    finally:
        upstream[1].close()


class _Exchange:
    def __init__(
        self,
        substitution: Substitution,
        sandbox_id: str,
        rules: HostRules,
        cell: _Side,
        upstream: _Side,
    ) -> None:
        self.substitution = substitution
        self.sandbox_id = sandbox_id
        self.rules = rules
        self.cell = cell
        self.upstream = upstream

    def _record(self, names: set[str]) -> None:
        for name in sorted(names):
            self.substitution.record(self.sandbox_id, name, self.rules.host, "substituted")

    async def run(self) -> None:
        """Request after request on the same two connections, until either side closes."""
        while True:
            try:
                event = await self.cell.next_event()
            except h11.RemoteProtocolError as exc:  # HTTP/2 without ALPN, say
                await self._answer(400, f"not an HTTP/1.1 request: {exc}")
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed
            if not await self._one(event):
                return
            if h11.MUST_CLOSE in (self.cell.conn.our_state, self.upstream.conn.our_state):
                return
            if self.upstream.conn.their_state is h11.MUST_CLOSE:
                return
            try:
                self.cell.conn.start_next_cycle()
                self.upstream.conn.start_next_cycle()
            except h11.LocalProtocolError:
                return  # one side is not done with the last exchange: start afresh

    async def _one(self, request: h11.Request) -> bool:
        """One request and its response; False when the connection must end."""
        if request.http_version not in (b"1.0", b"1.1"):  # HTTP/2 without ALPN, say
            await self._answer(400, "the relay to a host with secrets speaks HTTP/1.1 only")
            return False
        if request.method == b"CONNECT" or _header(request.headers, b"upgrade"):
            await self._answer(501, "upgrades and CONNECT are not relayed to a host with secrets")
            return False
        try:
            target, headers, used = self.rules.head(request.target, request.headers)
        except Refusal as refusal:
            return await self._refused(refusal)
        body = self.rules.body()
        length = _header(headers, b"content-length")
        substitutes = any("body" in b.where for b in self.rules.own)
        buffered: bytes | None = None
        if length is not None and substitutes:
            try:
                buffered = await self._whole_body(int(length), body)
            except Refusal as refusal:
                return await self._refused(refusal)
            headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
            headers.append((b"content-length", str(len(buffered)).encode()))
            headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
        try:
            head = h11.Request(method=request.method, target=target, headers=headers)
        except h11.LocalProtocolError as exc:  # a value no header can hold (a newline, say)
            await self._answer(400, f"the request cannot be sent: {exc}")
            return False
        self._record(used)
        # The head leaves with the body's first bytes, unless the client waits for a 100
        # before sending any.
        waits = _header(headers, b"expect") is not None
        await self.upstream.send(head, now=waits)
        sending = asyncio.ensure_future(self._send_body(body, buffered))
        answering = asyncio.ensure_future(self._respond(request.method))
        try:
            await asyncio.wait((sending, answering), return_when=asyncio.FIRST_COMPLETED)
            if sending.done():
                failure = sending.exception()
                if isinstance(failure, Refusal):
                    return await self._refused(failure)
                sending.result()  # raises what ended the body
                await answering
                return True
            answering.result()  # answered before the body was all sent: this connection ends
            return False
        finally:
            for task in (sending, answering):
                task.cancel()
            await asyncio.gather(sending, answering, return_exceptions=True)

    async def _whole_body(self, length: int, body: Rewriter) -> bytes:
        if length > MAX_REWRITTEN_BODY:
            raise Refusal(
                "",
                "refused_place",
                f"a request body that secrets are substituted in is read whole first: "
                f"{length} bytes exceed {MAX_REWRITTEN_BODY}",
            )
        if self.cell.conn.they_are_waiting_for_100_continue:
            await self.cell.send(h11.InformationalResponse(status_code=100, headers=[]))
        parts = []
        while True:
            event = await self.cell.next_event()
            if isinstance(event, h11.Data):
                parts.append(body.feed(event.data))
            elif isinstance(event, h11.EndOfMessage):
                parts.append(body.flush())
                self._record_body(body)
                return b"".join(parts)
            else:
                raise h11.RemoteProtocolError("the request body ended early")

    def _record_body(self, body: Rewriter) -> None:
        names = {b.name for b in self.rules.own if b.placeholder.encode() in body.used}
        self._record(names)

    async def _send_body(self, body: Rewriter, buffered: bytes | None) -> None:
        if buffered is not None:
            if buffered:
                await self.upstream.send(h11.Data(data=buffered))
            await self.upstream.send(h11.EndOfMessage())
            return
        await _stream(self.cell, self.upstream, body, "the request ended before its body")
        self._record_body(body)

    async def _respond(self, method: bytes) -> None:
        echo = self.rules.echo()
        while True:
            event = await self.upstream.next_event()
            if isinstance(event, h11.InformationalResponse):
                await self.cell.send(event)
                continue
            if not isinstance(event, h11.Response):
                raise h11.RemoteProtocolError("the upstream closed before its response")
            headers = self.rules.echo_head(event.headers)
            bodiless = method == b"HEAD" or event.status_code in (204, 304)
            if echo and self.rules.any_length_change() and not bodiless:
                length = _header(headers, b"content-length")
                headers = [(n, v) for n, v in headers if n.lower() not in FRAMING]
                if length is not None and length.isdigit() and int(length) <= MAX_REFRAMED:
                    # Small enough to read whole: sent with its right length, not chunked.
                    body = await _whole(self.upstream, echo)
                    headers.append((b"content-length", str(len(body)).encode()))
                    await self._send_response(event, headers)
                    await self.cell.send(h11.Data(data=body), now=False)
                    await self.cell.send(h11.EndOfMessage())
                    return
            await self._send_response(event, headers)
            break
        await _stream(self.upstream, self.cell, echo, "the upstream's response ended early")

    async def _send_response(self, event: h11.Response, headers: list[tuple[bytes, bytes]]) -> None:
        response = h11.Response(status_code=event.status_code, headers=headers, reason=event.reason)
        await self.cell.send(response, now=False)  # leaves with the body's first bytes

    async def _refused(self, refusal: Refusal) -> bool:
        if refusal.secret:
            self.substitution.record(
                self.sandbox_id, refusal.secret, self.rules.host, refusal.decision
            )
        await self._answer(403, f"refused by sandcell's secret substitution: {refusal.reason}")
        return False

    async def _answer(self, status: int, text: str) -> None:
        """The proxy's own answer on the cell's side (when no response has begun there)."""
        if self.cell.conn.our_state not in (h11.SEND_RESPONSE, h11.IDLE):
            return  # a response has begun: the connection just ends
        body = (text + "\n").encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"x-sandcell-egress", b"refused"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self.cell.send(h11.Response(status_code=status, headers=headers))
        await self.cell.send(h11.Data(data=body))
        await self.cell.send(h11.EndOfMessage())


async def _whole(source: _Side, rewrite: Rewriter) -> bytes:
    """One message's body, read whole through `rewrite`."""
    parts = []
    while True:
        event = await source.next_event()
        if isinstance(event, h11.Data):
            parts.append(rewrite.feed(event.data))
        elif isinstance(event, h11.EndOfMessage):
            parts.append(rewrite.flush())
            return b"".join(parts)
        else:
            raise h11.RemoteProtocolError("the upstream's response ended early")


async def _stream(source: _Side, sink: _Side, rewrite: Rewriter, early: str) -> None:
    """One message's body from `source` to `sink` through `rewrite` (h11 frames it anew)."""
    while True:
        event = await source.next_event()
        if isinstance(event, h11.Data):
            await sink.send_body(rewrite.parts(event.data))
        elif isinstance(event, h11.EndOfMessage):
            if rest := rewrite.flush():
                await sink.send(h11.Data(data=rest))
            await sink.send(h11.EndOfMessage())
            return
        else:
            raise h11.RemoteProtocolError(early)


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None
