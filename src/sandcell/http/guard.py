"""uvicorn's httptools protocol with the limits it lacks: no client may close the door.

uvicorn waits forever for a request head, reads headers of any size, waits forever for a
body and accepts connections until the process runs out of file descriptors. This subclass
drops connections that send no complete head within `header_timeout_s`, answers 431 past
`max_header_bytes`, answers 408 to bodies slower than `min_body_rate` (after a grace of
`body_timeout_s`), and caps open connections below RLIMIT_NOFILE. At the cap, a new
connection evicts the longest-idle one (no request in flight) rather than being refused, so
a flood of idle sockets cannot keep anyone out; only when every connection is busy is the
newcomer answered 503.

It writes responses as `OneWriteHttpToolsProtocol` does (a small answer in one send).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from sandcell.errors import ErrorCode, error_body
from sandcell.http.limits import TIMED_OUT, ConnectionLimits
from sandcell.http.onewrite import OneWriteHttpToolsProtocol


def _canned(status: str, code: ErrorCode, message: str, extra: str = "") -> bytes:
    body = json.dumps(error_body(code, message)).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode() + body


# The code says what the client must do (fix the request, or retry later); the status is the
# precise HTTP one. Written straight to the socket: no request reached the app.
TOO_MANY_CONNECTIONS = _canned(
    "503 Service Unavailable",
    ErrorCode.OVERLOADED,
    "too many open connections",
    "retry-after: 1\r\n",
)
HEADERS_TOO_LARGE = _canned(
    "431 Request Header Fields Too Large", ErrorCode.BAD_REQUEST, "request headers are too large"
)
BODY_TOO_SLOW = _canned(
    "408 Request Timeout", ErrorCode.BAD_REQUEST, "the request body did not arrive in time"
)


class HeadersTooLarge(Exception):
    """Raised from a parser callback: httptools stops parsing and reports an error."""


class Door:
    """What the connections of one server share: the limits, and the idle ones, oldest
    first (a dict keeps insertion order and removes in O(1))."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.cap = limits.connection_cap()
        self.idle: dict[GuardedHttpToolsProtocol, None] = {}

    def evict_oldest_idle(self) -> bool:
        if not self.idle:
            return False
        oldest = next(iter(self.idle))
        oldest.drop()
        return True


class GuardedHttpToolsProtocol(OneWriteHttpToolsProtocol):
    door: ClassVar[Door]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: Any = None
        self._head_bytes = 0
        self._parsed_head_bytes = 0
        self._oversized = False
        self._in_head = True
        self._reading_body = False
        self._body_deadline = 0.0  # by the average rate
        self._body_last = 0.0  # when body bytes last arrived

    # -- connections ---------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        door = self.door
        if len(self.connections) > door.cap and not door.evict_oldest_idle():
            self._answer_and_close(TOO_MANY_CONNECTIONS, True)
            return
        self._idle()
        self._arm(door.limits.header_timeout_s, self.drop)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.door.idle.pop(self, None)
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        self._disarm()
        self.door.idle.pop(self, None)
        super().handle_websocket_upgrade()

    def drop(self) -> None:
        """Closes at once: nothing is owed to a client that has not sent a request."""
        self._disarm()
        self.door.idle.pop(self, None)
        self.transport.abort()

    def _idle(self) -> None:
        self.door.idle[self] = None

    # -- the request head ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._in_head:
            # Counted once the parser is done with `data`: a chunk that completed the head
            # (and carried body bytes after it) is not counted as head.
            self._head_bytes += len(data)
            if self._head_bytes > self.door.limits.max_header_bytes:
                # Not over a response still being written for a pipelined request.
                self._answer_and_close(HEADERS_TOO_LARGE, self._between_responses())
        elif self._reading_body and self._timer is None:
            self._arm_at(self._body_deadline, self._body_check)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # A head that arrived whole in one chunk is only seen here, field by field.
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._parsed_head_bytes += size
        if self._parsed_head_bytes > self.door.limits.max_header_bytes:
            self._oversized = True
            raise HeadersTooLarge  # the parser stops; uvicorn calls send_400_response

    def send_400_response(self, msg: str) -> None:
        if self._oversized:
            self._answer_and_close(HEADERS_TOO_LARGE, self._between_responses())
        else:
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._timer is None:  # a keep-alive connection's next request: its first byte
            self._arm(self.door.limits.header_timeout_s, self.drop)

    def on_headers_complete(self) -> None:
        self._disarm()
        self.door.idle.pop(self, None)
        self._in_head = False
        self._head_bytes = self._parsed_head_bytes = 0
        self._reading_body = True
        self._body_last = self.loop.time()
        self._body_deadline = self._body_last + self.door.limits.body_timeout_s
        super().on_headers_complete()

    # -- the request body ------------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_deadline += len(body) / self.door.limits.min_body_rate
        self._body_last = self.loop.time()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_body = False
        self._disarm()

    def _body_check(self) -> None:
        """A body must keep coming (a pause of at most `body_timeout_s`) and, past that
        grace, average `min_body_rate`: both a stall and a trickle end in a 408."""
        self._timer = None
        now = self.loop.time()
        grace = self.door.limits.body_timeout_s
        if self.flow.read_paused:
            # The app is not reading (a slow upstream): not the client's fault.
            self._body_last = now
            self._body_deadline = max(self._body_deadline, now + grace)
        due = min(self._body_deadline, self._body_last + grace)
        if now < due:
            self._arm_at(due, self._body_check)
            return
        answer = not self.cycle.response_started
        if answer:
            self.scope[TIMED_OUT] = True  # type: ignore[literal-required]
        self._answer_and_close(BODY_TOO_SLOW, answer)

    # -- between requests ------------------------------------------------------------------------

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and self._between_responses():
            self._idle()

    # -- helpers ---------------------------------------------------------------------------------

    def _between_responses(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _answer_and_close(self, answer: bytes, write: bool) -> None:
        self._disarm()
        self.door.idle.pop(self, None)
        self._in_head = self._reading_body = False
        if write:
            self.transport.write(answer)
        self.transport.close()

    def _arm(self, delay_s: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, callback)

    def _arm_at(self, when: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_at(when, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)`, with a door of its own."""
    return type("GuardedHttpTools", (GuardedHttpToolsProtocol,), {"door": Door(limits)})
