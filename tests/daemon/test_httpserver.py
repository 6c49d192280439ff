"""The daemon's own HTTP/1.1 server, spoken to byte by byte on its unix socket."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell import tokens
from sandcell.daemon.http import server as httpserver
from support.daemons import RunningDaemon


@pytest.fixture
def conn(daemon: RunningDaemon) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(daemon.uds))
    yield sock
    sock.close()


def _signed(daemon: RunningDaemon, method: str, target: str, body: bytes | None) -> str:
    token = tokens.mint_request_token(daemon.session_key, daemon.sandbox_id, method, target, body)
    return f"authorization: Bearer {token}\r\n"


def _exec(daemon: RunningDaemon, command: str, extra: str = "") -> bytes:
    body = json.dumps({"command": command}).encode()
    auth = _signed(daemon, "POST", "/v1/exec", body)
    head = f"POST /v1/exec HTTP/1.1\r\nhost: d\r\n{auth}content-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def _response(sock: socket.socket, buffered: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response off the connection (Content-Length or chunked); the rest stays."""
    while b"\r\n\r\n" not in buffered:
        buffered += _recv(sock)
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    buffered[:] = rest
    if "content-length" in headers:
        size = int(headers["content-length"])
        while len(buffered) < size:
            buffered += _recv(sock)
        body = bytes(buffered[:size])
        del buffered[:size]
    else:
        body = _dechunk(sock, buffered)
    return int(lines[0].split()[1]), headers, body


def _dechunk(sock: socket.socket, buffered: bytearray) -> bytes:
    body = b""
    while True:
        while b"\r\n" not in buffered:
            buffered += _recv(sock)
        size_line, _, _ = bytes(buffered).partition(b"\r\n")
        size = int(size_line, 16)
        while len(buffered) < len(size_line) + 2 + size + 2:
            buffered += _recv(sock)
        start = len(size_line) + 2
        body += bytes(buffered[start : start + size])
        del buffered[: start + size + 2]
        if size == 0:
            return body


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise ConnectionError("closed")
    return data


def test_keep_alive_and_pipelined_requests_answer_in_order(daemon, conn):
    conn.sendall(b"".join(_exec(daemon, f"echo {n}") for n in range(5)))
    buffered = bytearray()
    outs = [json.loads(_response(conn, buffered)[2])["stdout"] for _ in range(5)]
    assert outs == [f"{n}\n" for n in range(5)]
    conn.sendall(b"GET /health HTTP/1.1\r\nhost: d\r\n\r\n")
    assert _response(conn, buffered)[0] == 200


def test_chunked_request_body(daemon, conn):
    body = json.dumps({"command": "echo chunked"}).encode()
    auth = _signed(daemon, "POST", "/v1/exec", body)
    pieces = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (body[:7], body[7:])) + b"0\r\n\r\n"
    head = f"POST /v1/exec HTTP/1.1\r\nhost: d\r\n{auth}transfer-encoding: chunked\r\n\r\n"
    conn.sendall(head.encode() + pieces)
    status, _, answer = _response(conn, bytearray())
    assert status == 200 and json.loads(answer)["stdout"] == "chunked\n"


def test_chunked_body_over_the_limit_is_413(daemon, conn):
    auth = _signed(daemon, "POST", "/v1/exec", b"")
    conn.sendall(
        f"POST /v1/exec HTTP/1.1\r\nhost: d\r\n{auth}transfer-encoding: chunked\r\n\r\n".encode()
    )
    chunk = b" " * 1_048_576
    status = None
    try:
        for _ in range(9):
            conn.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
    except OSError:
        pass  # answered and closed before the whole body went out
    status, _, body = _response(conn, bytearray())
    assert status == 413 and json.loads(body)["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_expect_100_continue(daemon, conn):
    request = _exec(daemon, "echo go", "expect: 100-continue\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    conn.sendall(head + b"\r\n\r\n")
    assert conn.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.sendall(body)
    assert json.loads(_response(conn, bytearray())[2])["stdout"] == "go\n"


def test_head_has_no_body(conn):
    conn.sendall(b"HEAD /health HTTP/1.1\r\nhost: d\r\n\r\nGET /health HTTP/1.1\r\nhost: d\r\n\r\n")
    buffered = bytearray()
    while not buffered.endswith(b"}"):
        buffered += _recv(conn)
    head, get = bytes(buffered).split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: " in head
    assert get.startswith(b"HTTP/1.1 200 OK\r\n")  # nothing between the two answers


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT HTTP\r\n\r\n",
        b"GET / HTTP/1.1\r\ncontent-length: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nx: " + b"a" * (httpserver.MAX_HEAD_BYTES + 1) + b"\r\n\r\n",
        b"POST /v1/exec HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_malformed_requests_are_400_and_closed(conn, raw):
    conn.sendall(raw)
    received = b""
    while chunk := conn.recv(65536):
        received += chunk
    assert received.startswith(b"HTTP/1.1 400 ")


def test_streamed_response_waits_for_a_slow_reader(daemon, conn):
    """A reader that does not read holds the writer back: the daemon does not buffer it all."""
    size = 64 * 1_048_576
    (daemon.workspace / "big").write_bytes(b"\0" * size)
    target = "/v1/files?path=big"
    conn.sendall(
        f"GET {target} HTTP/1.1\r\nhost: d\r\n{_signed(daemon, 'GET', target, None)}\r\n".encode()
    )
    time.sleep(1.5)
    rss_kib = _rss_kib(daemon.proc.pid)
    assert rss_kib < 100 * 1024, rss_kib  # not the 64 MiB file held in the daemon
    status, _, body = _response(conn, bytearray())
    assert status == 200 and len(body) == size


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_leaving_a_quiet_stream_stops_its_command(daemon, conn):
    """The streamed exec waits for output that does not come; the client hangs up: the
    command is killed at once, not when it next writes."""
    marker = f"quiet-{time.monotonic_ns()}"
    body = json.dumps({"command": f"echo started; sleep 30; : {marker}"}).encode()
    auth = _signed(daemon, "POST", "/v1/exec", body)
    head = (
        f"POST /v1/exec HTTP/1.1\r\nhost: d\r\n{auth}accept: application/x-ndjson\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    conn.sendall(head.encode() + body)
    received = b""
    while b"started" not in received:
        received += _recv(conn)
    assert _pids_with(marker)
    conn.close()
    deadline = time.monotonic() + 5
    while _pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pids_with(marker)


def _pids_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found
