"""The daemon's exposed-port relay against a real HTTP server (here the daemon runs outside a
cell, so its 127.0.0.1 is the host's; in a cell it is the cell's own)."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import pytest

from sandcell import tokens
from sandcell.network.websocket import Rejected, Upstream
from support.server import free_port


class _App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for piece in (b"one ", b"two"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        body = f"{self.path} auth={self.headers.get('authorization')}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.send_header("x-app", "yes")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.send_response(201)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[::-1])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def app_port() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _App)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def test_get_with_query_and_headers(client, app_port):
    r = client.signed_request("GET", f"/v1/ports/{app_port}/a/b?x=1")
    assert r.status_code == 200
    assert r.text == "/a/b?x=1 auth=None"  # the daemon's token stops at the daemon
    assert r.headers["x-app"] == "yes"


def test_post_body_and_chunked_response(client, app_port):
    r = client.signed_request("POST", f"/v1/ports/{app_port}/echo", content=b"hello")
    assert r.status_code == 201 and r.content == b"olleh"
    r = client.signed_request("GET", f"/v1/ports/{app_port}/chunked")
    assert r.status_code == 200 and r.text == "one two"


def test_nothing_listening_is_502(client):
    r = client.signed_request("GET", f"/v1/ports/{free_port()}/")
    assert r.status_code == 502 and r.json()["error"]["code"] == "SANDBOX_UNREACHABLE"


@pytest.mark.parametrize("port", ["0", "65536", "abc", "-1", "٣"])
def test_invalid_ports_are_400(client, port):
    assert client.signed_request("GET", f"/v1/ports/{port}/").status_code == 400


def test_unsigned_requests_are_refused(client, app_port):
    assert client.http.get(f"/v1/ports/{app_port}/").status_code == 401


async def _upgrade(daemon, target: str, token: str | None) -> None:
    upstream = Upstream(*await asyncio.open_unix_connection(str(daemon.uds)))
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        await upstream.handshake("sandcell-daemon", target, headers=headers)
    finally:
        upstream.close()


@pytest.mark.parametrize("signed_for", [None, "/v1/ports/1/other", "/v1/exec"])
def test_websocket_upgrades_must_be_signed_for_their_path(client, daemon, app_port, signed_for):
    target = f"/v1/ports/{app_port}/ws"
    token = signed_for and tokens.mint_request_token(
        daemon.session_key, daemon.sandbox_id, "GET", signed_for, b""
    )
    with pytest.raises(Rejected, match="401"):
        asyncio.run(_upgrade(daemon, target, token))


def test_a_signed_upgrade_to_a_plain_http_app_is_refused_cleanly(client, daemon, app_port):
    """The app speaks no WebSocket: the daemon refuses the upgrade instead of hanging."""
    target = f"/v1/ports/{app_port}/ws"
    token = tokens.mint_request_token(daemon.session_key, daemon.sandbox_id, "GET", target, b"")
    with pytest.raises(Rejected):
        asyncio.run(_upgrade(daemon, target, token))
