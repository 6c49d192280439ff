"""Who a record names is who sent that request: a request pipelined behind another on one
connection starts in its predecessor's context, and must not inherit its caller. Here an
API-key call is followed, on the same connection and in the same write, by an E2B envd call
that carries only the sandbox's access token."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from sdk.helpers import served
from support.server import RunningServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("pipelined"), warm_pool=1)


def test_a_pipelined_request_does_not_inherit_the_callers_key(server: RunningServer) -> None:
    key = server.create_key("first-caller")
    with server.client(key) as http:
        made = http.post("/e2b/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": key})
        assert made.status_code == 201, made.text
        sandbox, token = made.json()["sandboxID"], made.json()["envdAccessToken"]
        content = b"written by the access token alone"
        first = f"GET /v1/sandboxes HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key}\r\n\r\n"
        second = (
            "POST /e2b/files?path=/home/user/p.txt HTTP/1.1\r\nHost: t\r\n"
            f"E2b-Sandbox-Id: {sandbox}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(content)}\r\n"
            "Connection: close\r\n\r\n"
        )
        url = urlsplit(server.url)
        with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
            conn.sendall(first.encode() + second.encode() + content)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.count(b"HTTP/1.1 200 OK") == 2, answer[:500]
        records = http.get("/v1/audit", params={"sandbox": sandbox}).json()["records"]
        http.delete(f"/v1/sandboxes/{sandbox}")
    (write,) = [r for r in records if r["action"] == "file.write"]
    assert (write["principal"], write["key_name"]) == ("first-caller", "")
