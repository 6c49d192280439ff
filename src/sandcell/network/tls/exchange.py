"""The requests and responses of one intercepted connection, in its relay's thread.

h11 frames both sides: each request's head gets its placeholders substituted
(`HostRules.head`), its body streams through a `Rewriter` (re-chunked by h11 when chunked;
with a `Content-Length` that substitution changes, read whole first, within
`MAX_REWRITTEN_BODY`, so the length sent is right), and each response streams back with any
echo of a value replaced by its placeholder; a response whose length that could change is
read whole up to `MAX_REFRAMED` and sent with its new length, a longer one is sent chunked.
A refused placeholder never reaches the upstream: in the head it stops the request before
anything is sent; in a streamed body the chunk that holds it is never sent (the upstream
gets an incomplete request and the connection closes). Either way the cell gets a 403
naming the secret and the host.

One thread serves both directions: while a request body streams, the upstream is looked at
between chunks, so a `100 Continue` is passed on and a response that begins before the body
is all sent is relayed, even once the upstream has closed on the rest (the connection then
ends, as the request is incomplete).
"""

from __future__ import annotations

from collections.abc import Iterable

import h11

from sandcell.network.tls.blocking import Side, wait_readable
from sandcell.network.tls.rewrite import HostRules, Refusal, Rewriter
from sandcell.secrets.bindings import UseRecorder

MAX_REWRITTEN_BODY = 16 * 1_048_576
# A response whose length an echo could change is read whole up to this size (its length
# stays known to the client); a longer one is sent chunked.
MAX_REFRAMED = 1_048_576
# Framing is h11's to set on the way out: these come from the other side's framing.
FRAMING = {b"content-length", b"transfer-encoding"}


class Exchange:
    def __init__(
        self,
        record: UseRecorder,
        sandbox_id: str,
        rules: HostRules,
        cell: Side,
        upstream: Side,
    ) -> None:
        self.record = record  # safe from this thread (the loop's own runs it)
        self.sandbox_id = sandbox_id
        self.rules = rules
        self.cell = cell
        self.upstream = upstream

    def _record(self, names: set[str]) -> None:
        for name in sorted(names):
            self.record(self.sandbox_id, name, self.rules.host, "substituted")

    def run(self) -> None:
        """Request after request on the same two connections, until either side closes."""
        while True:
            try:
                event = self.cell.next_event()
            except h11.RemoteProtocolError as exc:  # HTTP/2 without ALPN, say
                self._answer(400, f"not an HTTP/1.1 request: {exc}")
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed
            if not self._one(event):
                return
            if h11.MUST_CLOSE in (self.cell.conn.our_state, self.upstream.conn.our_state):
                return
            if self.upstream.conn.their_state is h11.MUST_CLOSE or self.upstream.spent:
                return
            if self._upstream_spoke():
                return
            try:
                self.cell.conn.start_next_cycle()
                self.upstream.next_cycle()
            except h11.LocalProtocolError:
                return  # one side is not done with the last exchange: start afresh

    def _upstream_spoke(self) -> bool:
        """Whether the upstream has sent what no request asked for (bytes past its response,
        read whole by h11 or not), or closed: then no request may follow on this connection,
        as those bytes would be taken for its response."""
        self.upstream.receive(wait=False)
        data, closed = self.upstream.conn.trailing_data
        return bool(data) or closed

    def _one(self, request: h11.Request) -> bool:
        """One request and its response; False when the connection must end."""
        if self._upstream_spoke():
            return False  # the request is not answered: the client retries on a new one
        if request.http_version not in (b"1.0", b"1.1"):  # HTTP/2 without ALPN, say
            self._answer(400, "the relay to a host with secrets speaks HTTP/1.1 only")
            return False
        if request.method == b"CONNECT" or _header(request.headers, b"upgrade"):
            self._answer(501, "upgrades and CONNECT are not relayed to a host with secrets")
            return False
        try:
            target, headers, used = self.rules.head(request.target, request.headers)
        except Refusal as refusal:
            return self._refused(refusal)
        body = self.rules.body()
        length = _header(headers, b"content-length")
        buffered: bytes | None = None
        if length is not None and any("body" in b.where for b in self.rules.own):
            try:
                buffered = self._whole_body(int(length), body)
            except Refusal as refusal:
                return self._refused(refusal)
            headers = [
                (n, v) for n, v in headers if n.lower() not in (b"content-length", b"expect")
            ]
            headers.append((b"content-length", str(len(buffered)).encode()))
        try:
            head = h11.Request(method=request.method, target=target, headers=headers)
        except h11.LocalProtocolError as exc:  # a value no header can hold (a newline, say)
            self._answer(400, f"the request cannot be sent: {exc}")
            return False
        self._record(used)
        # The head leaves with the body's first bytes, unless the client waits for a 100
        # before sending any.
        self.upstream.send(head, now=_header(headers, b"expect") is not None)
        if buffered is not None:
            if buffered:
                self.upstream.send(h11.Data(data=buffered), now=False)
            self.upstream.send(h11.EndOfMessage())
            self._respond(request.method, None)
            return True
        try:
            early = self._send_body(body)
        except Refusal as refusal:
            return self._refused(refusal)
        self._respond(request.method, early)
        return early is None

    def _whole_body(self, length: int, body: Rewriter) -> bytes:
        if length > MAX_REWRITTEN_BODY:
            raise Refusal(
                "",
                "refused_place",
                f"a request body that secrets are substituted in is read whole first: "
                f"{length} bytes exceed {MAX_REWRITTEN_BODY}",
            )
        if self.cell.conn.they_are_waiting_for_100_continue:
            self.cell.send(h11.InformationalResponse(status_code=100, headers=[]))
        parts = _read_whole(self.cell, body, "the request body ended early")
        self._record_body(body)
        return parts

    def _record_body(self, body: Rewriter) -> None:
        names = {b.name for b in self.rules.own if b.placeholder.encode() in body.used}
        self._record(names)

    def _send_body(self, body: Rewriter) -> object | None:
        """Streams the request body to the upstream; returns the upstream's response (its
        first event) if it began before the body ended, else None."""
        while True:
            event = self.cell.conn.next_event()
            if event is h11.NEED_DATA:
                early = self._upstream_early()
                if early is not None:
                    return early
                continue
            if isinstance(event, h11.Data):
                try:
                    self.upstream.send_body(body.parts(event.data))
                except OSError:  # a reset: the upstream may have answered and closed
                    if (answer := self._answer_after_reset()) is None:
                        raise
                    return answer
            elif isinstance(event, h11.EndOfMessage):
                _finish(self.upstream, body)
                self._record_body(body)
                return None
            else:
                raise h11.RemoteProtocolError("the request ended before its body")

    def _answer_after_reset(self) -> object | None:
        """The response an upstream sent before it closed on a body it would not read (the
        kernel still holds what came before the reset), if it sent one."""
        try:
            event = self.upstream.ready_event()
        except (OSError, h11.ProtocolError):
            return None
        return event if isinstance(event, h11.Response) else None

    def _upstream_early(self) -> object | None:
        """Waits until the cell sends more of its body or the upstream answers: a 100 is
        passed on (and waiting goes on); a response is handed back."""
        for side in wait_readable((self.cell, self.upstream), self.cell.idle_s):
            if side is self.cell:
                self.cell.receive(wait=False)
                continue
            event = self.upstream.ready_event()
            if isinstance(event, h11.InformationalResponse):
                self.cell.send(event)
            elif event is not h11.NEED_DATA:  # a TLS record without data: a session ticket
                return event
        return None

    def _respond(self, method: bytes, first: object | None) -> None:
        echo = self.rules.echo()
        while True:
            event, first = (first if first is not None else self.upstream.next_event()), None
            if isinstance(event, h11.InformationalResponse):
                self.cell.send(event)
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
                    body = _read_whole(self.upstream, echo, "the upstream's response ended early")
                    headers.append((b"content-length", str(len(body)).encode()))
                    self._send_response(event, headers)
                    self.cell.send(h11.Data(data=body), now=False)
                    self.cell.send(h11.EndOfMessage())
                    return
            self._send_response(event, headers)
            break
        size = _sized(event, bodiless)
        if size is None:
            _stream(self.upstream, self.cell, echo, "the upstream's response ended early")
        else:
            self._relay_sized(event, size, echo)

    def _relay_sized(self, response: h11.Response, length: int, echo: Rewriter) -> None:
        """A response body of `length` bytes (its `Content-Length`), read past h11 (which
        would copy each byte twice) straight from the socket's buffer into the rewrite and
        out through the cell's h11 (which frames it, chunked when an echo may change its
        length). h11 then starts afresh on the upstream's side, for the next request when
        both sides allowed one."""
        upstream = self.upstream
        held, _ = upstream.conn.trailing_data  # what came with the head
        first = held[:length]
        if first:
            self.cell.send_body(echo.parts(first))
        remaining = length - len(first)
        while remaining:
            got = upstream.read_raw(upstream.raw, remaining)
            if not got:
                raise h11.RemoteProtocolError("the upstream's response ended early")
            self.cell.send_body(echo.parts(upstream.raw, got))
            remaining -= got
        _finish(self.cell, echo)
        reusable = (
            upstream.conn.our_state is h11.DONE  # the request was sent whole, kept alive
            and response.http_version == b"1.1"
            and b"close" not in (_header(response.headers, b"connection") or b"").lower()
            and len(held) == len(first)  # nothing came past the body
        )
        upstream.restart(reusable)

    def _send_response(self, event: h11.Response, headers: list[tuple[bytes, bytes]]) -> None:
        response = h11.Response(status_code=event.status_code, headers=headers, reason=event.reason)
        self.cell.send(response, now=False)  # leaves with the body's first bytes

    def _refused(self, refusal: Refusal) -> bool:
        if refusal.secret:
            self.record(self.sandbox_id, refusal.secret, self.rules.host, refusal.decision)
        self._answer(403, f"refused by sandcell's secret substitution: {refusal.reason}")
        return False

    def _answer(self, status: int, text: str) -> None:
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
        self.cell.send(h11.Response(status_code=status, headers=headers), now=False)
        self.cell.send(h11.Data(data=body), now=False)
        self.cell.send(h11.EndOfMessage())


def _read_whole(source: Side, rewrite: Rewriter, early: str) -> bytes:
    """One message's body, read whole through `rewrite`."""
    parts = []
    while True:
        event = source.next_event()
        if isinstance(event, h11.Data):
            parts.append(rewrite.feed(event.data))
        elif isinstance(event, h11.EndOfMessage):
            parts.append(rewrite.flush())
            return b"".join(parts)
        else:
            raise h11.RemoteProtocolError(early)


def _stream(source: Side, sink: Side, rewrite: Rewriter, early: str) -> None:
    """One message's body from `source` to `sink` through `rewrite` (h11 frames it anew)."""
    while True:
        event = source.next_event()
        if isinstance(event, h11.Data):
            sink.send_body(rewrite.parts(event.data))
        elif isinstance(event, h11.EndOfMessage):
            _finish(sink, rewrite)
            return
        else:
            raise h11.RemoteProtocolError(early)


def _finish(sink: Side, rewrite: Rewriter) -> None:
    """A body's end: what the rewrite held back, then h11's end of the message."""
    if rest := rewrite.flush():
        sink.send(h11.Data(data=rest), now=False)
    sink.send(h11.EndOfMessage())


def _sized(response: h11.Response, bodiless: bool) -> int | None:
    """The body's length when the head gives it (and nothing else frames the body)."""
    if bodiless or _header(response.headers, b"transfer-encoding") is not None:
        return None
    length = _header(response.headers, b"content-length")
    return int(length) if length is not None and length.isdigit() else None


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None
