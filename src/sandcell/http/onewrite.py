"""uvicorn's httptools protocol, writing a small response in one send.

uvicorn writes a response's head as soon as the app starts it, and its body apart: two sends
where a small answer needs one, and a client reading it wakes twice. Here the head of a
response that declares its length waits for the body's first bytes and leaves with them.
Every write then waits for the end of the event loop's turn, so what a streamed response
makes of one upstream read (an E2B command's start, end and end of stream) leaves in one
send; past FLUSH_BYTES it goes at once, so uvicorn's flow control sees the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FLUSH_BYTES = 65536


class HeadWithBody:
    """The socket as one response cycle writes to it: a head declaring a length is held
    until the body's first write, and leaves with it."""

    def __init__(self, transport: Any, cycle: Any) -> None:
        self.transport = transport
        self.cycle = cycle
        self.held = b""
        self.head_seen = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def write(self, data: bytes) -> None:
        if not self.head_seen and self.cycle.response_started:
            self.head_seen = True  # this is the head (a 100 Continue comes before the start)
            if self.cycle.expected_content_length > 0 and self.cycle.scope["method"] != "HEAD":
                self.held = data
                return
        if self.held:
            data, self.held = self.held + data, b""
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(data)
        self.pending_bytes += len(data)
        if self.pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.pending and not self.transport.is_closing():
            self.transport.write(b"".join(self.pending))
        self.pending.clear()
        self.pending_bytes = 0

    def close(self) -> None:
        if self.held:  # an app that failed mid-response: the head goes, the client sees it cut
            self.pending.append(self.held)
            self.held = b""
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


# A scope key: called, it drops the connection with a reset (no end of the response). For a
# relay whose upstream dropped mid-stream, so its client sees a drop too, not a stream that
# ended well: some clients (e2b 2.45's) take only a reset as a connection lost.
ABORT = "sandcell.abort"
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


def _reset(transport: Any) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
    transport.abort()


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not previous:  # a new cycle, whose task has not run yet
            self.cycle.transport = cast(Any, HeadWithBody(self.transport, self.cycle))
            reset = functools.partial(_reset, self.transport)
            self.cycle.scope[ABORT] = reset  # type: ignore[literal-required]
