"""The CLI's blocking WebSocket client (wsproto) against a real uvicorn server on loopback:
messages both ways and in pieces, a refused upgrade with the server's answer, a server
that closes, and one that is not there."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from sandcell.cli import websocket as ws


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") == "bye":
            await websocket.close(1000)
            return
        if message.get("text") is not None:
            await websocket.send_text("echo " + message["text"])
        else:
            await websocket.send_bytes(message["bytes"][::-1])


async def _refuse(websocket: WebSocket) -> None:
    body = {"error": {"code": "SANDBOX_NOT_FOUND", "message": "no", "details": {}}}
    await websocket.send_denial_response(JSONResponse(body, status_code=404))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = Starlette(routes=[WebSocketRoute("/echo", _echo), WebSocketRoute("/no", _refuse)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, ws="wsproto", log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    yield f"ws://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_messages_both_ways(url: str) -> None:
    conn = ws.connect(f"{url}/echo?x=1", {"x-test": "1"}, 5)
    with contextlib.closing(conn):
        received = conn.messages()
        conn.send("hi")
        assert next(received) == "echo hi"
        big = bytes(range(256)) * 1024  # arrives in several reads
        conn.send(big)
        assert next(received) == big[::-1]
        conn.send("bye")  # the server closes: the messages end
        assert list(received) == []


def test_a_refused_upgrade_carries_the_servers_answer(url: str) -> None:
    with pytest.raises(ws.Refused) as refused:
        ws.connect(f"{url}/no", {}, 5)
    assert refused.value.status == 404
    assert b"SANDBOX_NOT_FOUND" in refused.value.body
    assert refused.value.headers["content-type"] == "application/json"


def test_nothing_listening_is_an_os_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OSError):
        ws.connect(f"ws://127.0.0.1:{port}/", {}, 5)
