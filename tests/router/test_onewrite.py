"""The router's HTTP protocol writes a response that declares its length in one piece, and
what a stream makes in one turn of the event loop in one send; HEAD answers and failed
responses as before. Real uvicorn on a unix socket; the apps pause between the head and the
body (but for /burst), so what a client reads first shows the writes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from sandcell.http.onewrite import OneWriteHttpToolsProtocol
from support.proxying import InLoopServer

PAUSE_S = 0.1


BIG = 200_000  # past FLUSH_BYTES: it leaves at once, so uvicorn's flow control sees it


async def burst(send: Send, size: int) -> None:
    """A stream's head and three chunks, made without a pause (one upstream read's worth)."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for part in (b"start", b"x" * size, b"end"):
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["path"] in ("/burst", "/big"):
        await burst(send, BIG if scope["path"] == "/big" else 1)
        return
    streamed = scope["path"] == "/stream"
    length = [] if streamed else [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await asyncio.sleep(PAUSE_S)
    if scope["path"] == "/fail":
        raise RuntimeError("the app fails after starting its answer")
    await send({"type": "http.response.body", "body": b"hello", "more_body": streamed})
    if streamed:
        await send({"type": "http.response.body", "body": b""})


SENDS: list[bytes] = []


class CountingProtocol(OneWriteHttpToolsProtocol):
    """The router's protocol over a transport that notes each write it is given (each one
    a send on the socket)."""

    def connection_made(self, transport: Any) -> None:
        write = transport.write

        def noted(data: bytes) -> None:
            SENDS.append(bytes(data))
            write(data)

        transport.write = noted
        super().connection_made(transport)


async def first_read(uds: Path, request: bytes) -> tuple[bytes, bytes]:
    """(the first bytes that arrive, all of them until the server closes)."""
    reader, writer = await asyncio.open_unix_connection(str(uds))
    writer.write(request)
    first = await reader.read(65536)
    rest = await reader.read()
    writer.close()
    return first, first + rest


def request(method: str, path: str) -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()


@pytest.mark.anyio
async def test_head_and_body_leave_together_only_when_that_is_right(tmp_path: Path) -> None:
    uds = tmp_path / "s.sock"
    config = uvicorn.Config(
        app, uds=str(uds), http=CountingProtocol, lifespan="off", log_level="critical"
    )
    server = InLoopServer(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        first, whole = await first_read(uds, request("GET", "/small"))
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\nhello")
        assert first == whole

        first, whole = await first_read(uds, request("GET", "/stream"))
        assert first.endswith(b"transfer-encoding: chunked\r\n\r\n")  # the head did not wait
        assert whole.endswith(b"5\r\nhello\r\n0\r\n\r\n")

        SENDS.clear()
        first, whole = await first_read(uds, request("GET", "/burst"))
        assert [whole] == SENDS  # one send, to the end
        assert whole.endswith(b"5\r\nstart\r\n1\r\nx\r\n3\r\nend\r\n0\r\n\r\n")

        SENDS.clear()
        _, whole = await first_read(uds, request("GET", "/big"))
        assert len(SENDS) == 2 and b"".join(SENDS) == whole
        assert whole.count(b"x") == BIG and whole.endswith(b"3\r\nend\r\n0\r\n\r\n")

        first, whole = await first_read(uds, request("HEAD", "/small"))
        assert b"content-length: 5\r\n" in first and whole.endswith(b"\r\n\r\n")  # no body

        first, whole = await first_read(uds, request("GET", "/fail"))
        assert b"content-length: 5\r\n" in first and whole.endswith(b"\r\n\r\n")  # cut short
    finally:
        server.should_exit = True
        await task
        uds.unlink(missing_ok=True)
