"""Bad input at the router (and through it, at a real cell's daemon) and at a bare daemon:
malformed JSON, huge headers and bodies, invalid UTF-8, path tricks, broken framing.

Whatever comes in, the answer is a 4xx with the error shape (SPEC §1), never a 5xx, a stack
trace or a hang, and the server keeps serving.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reliability.harness import (
    assert_error_shape,
    code,
    raw_http,
    rss_bytes,
    server_keys,
    servers,
)
from support.daemons import RunningDaemon, launch_daemon
from support.server import SMALL_TEMPLATE, RunningServer

MIB = 1024 * 1024
JSON = {"content-type": "application/json"}
HOST_SECRET = "root:x:0:0:root"  # the host's /etc/passwd line; the cell's own reads "::/:"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with servers(tmp_path_factory.mktemp("bad-input")) as fleet:
        yield fleet.start("data", config_text=SMALL_TEMPLATE.format(warm_pool=0))


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.create_key("fuzzy")


@pytest.fixture(scope="module")
def sid(server: RunningServer, key: str) -> Iterator[str]:
    with server.client(key) as c:
        r = c.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sandbox = r.json()["id"]
        setup = "mkdir -p sub && echo hello > sub/a.txt && ln -s / root && ln -s /etc/passwd pw"
        r = c.post(f"/v1/sandboxes/{sandbox}/exec", json={"command": setup})
        assert r.json()["exit_code"] == 0, r.text
        yield sandbox
        c.delete(f"/v1/sandboxes/{sandbox}")


@pytest.fixture
def c(server: RunningServer, key: str) -> Iterator[httpx.Client]:
    with server.client(key, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    d = launch_daemon(tmp_path_factory.mktemp("bare-daemon"))
    d.initialize()
    yield d
    d.stop()


def _still_serving(c: httpx.Client, sid: str) -> None:
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo ok"})
    assert r.status_code == 200 and r.json()["stdout"] == "ok\n", r.text


def _bad(r: httpx.Response, *statuses: int) -> dict:
    assert r.status_code in statuses, (r.status_code, r.text[:300])
    return assert_error_shape(r)


# -- malformed JSON ------------------------------------------------------------------------------

MALFORMED = {
    "truncated": b'{"command": "echo',
    "array": b"[]",
    "null": b"null",
    "string": b'"echo hi"',
    "number": b"42",
    "invalid-utf8": b"\xff\xfe{}",
    "invalid-utf8-in-string": b'{"command": "echo \xff\xfe"}',
    "lone-surrogate": b'{"command": "echo \\ud800"}',
    "nul": b"\x00",
    "two-objects": b"{}{}",
    "trailing-garbage": b'{"command": "true"} x',
    "single-quotes": b"{'command': 'true'}",
    "infinity": b'{"command": "true", "timeout_s": 1e999}',
    "huge-number": b'{"command": "true", "timeout_s": ' + b"9" * 5000 + b"}",
    "wrong-types": b'{"command": {"a": 1}, "env": [1], "cwd": 7}',
    "deep-object": b'{"command": "true", "env": ' + b'{"a": ' * 200 + b"1" + b"}" * 201,
    "bom": b'\xef\xbb\xbf{"command": "true"}',
}
ROUTER_JSON_ENDPOINTS = ("create", "keepalive", "exec", "mkdir", "move")


def _path(endpoint: str, sid: str) -> str:
    return {
        "create": "/v1/sandboxes",
        "keepalive": f"/v1/sandboxes/{sid}/keepalive",
        "exec": f"/v1/sandboxes/{sid}/exec",
        "mkdir": f"/v1/sandboxes/{sid}/files/mkdir",
        "move": f"/v1/sandboxes/{sid}/files/move",
    }[endpoint]


@pytest.mark.parametrize("endpoint", ROUTER_JSON_ENDPOINTS)
@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_router_malformed_json_is_400(c, sid, endpoint, body):
    r = c.post(_path(endpoint, sid), content=body, headers=JSON)
    assert _bad(r, 400)["code"] == "BAD_REQUEST"


def test_router_empty_bodies(c, sid):
    assert c.post(_path("keepalive", sid), content=b"").status_code == 200  # optional body
    for endpoint in ("create", "exec", "mkdir", "move"):
        assert code(c.post(_path(endpoint, sid), content=b"", headers=JSON)) == "BAD_REQUEST"
    _still_serving(c, sid)


@pytest.mark.parametrize("endpoint", ["create", "keepalive"])
def test_router_deeply_nested_json_is_400(c, sid, endpoint):
    body = b"[" * 100_000 + b"]" * 100_000
    assert _bad(c.post(_path(endpoint, sid), content=body, headers=JSON), 400)


def test_router_deeply_nested_exec_body_is_400(server, key, sid):
    body = b'{"command": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with server.client(key) as fresh:
        try:
            r = fresh.post(_path("exec", sid), content=body, headers=JSON)
        except httpx.TransportError as exc:
            pytest.fail(f"the router dropped the connection: {exc!r}")
    assert _bad(r, 400)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_create_with_an_invalid_env_is_a_fast_400(server, key):
    with server.client(key, timeout=30) as c:
        try:
            r = c.post("/v1/sandboxes", json={"env": {"A=B": "x"}})
        except httpx.TransportError as exc:
            pytest.fail(f"connection dropped: {exc!r}")
        assert r.status_code == 400 and r.elapsed.total_seconds() < 2, (r.status_code, r.elapsed)


@pytest.mark.parametrize("endpoint", ["/v1/exec", "/v1/files/mkdir", "/v1/files/move", "/init"])
@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_daemon_malformed_json_is_400(daemon, endpoint, body):
    with daemon.client() as d:
        if endpoint == "/init":
            r = d.http.post(endpoint, content=body, headers=JSON)
        else:
            r = d.signed_request("POST", endpoint, content=body, headers=JSON)
    assert _bad(r, 400)["code"] == "BAD_REQUEST"


def test_daemon_deeply_nested_and_nul_laden_json_is_400(daemon):
    bodies = [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"command": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        json.dumps({"command": "true", "env": {"A\u0000B": "x"}}).encode(),
        json.dumps({"command": "true", "env": {"A": "x\u0000"}}).encode(),
        json.dumps({"command": "true", "env": {"A=B": "x"}}).encode(),
        json.dumps({"command": "true", "env": {"": "x"}}).encode(),
        json.dumps({"command": ["echo", "a\u0000b"]}).encode(),
        json.dumps({"command": []}).encode(),
        json.dumps({"command": "true", "cwd": "a\u0000"}).encode(),
    ]
    with daemon.client() as d:
        for body in bodies:
            r = d.signed_request("POST", "/v1/exec", content=body, headers=JSON)
            assert _bad(r, 400)["code"] == "BAD_REQUEST", body[:80]
        assert d.exec("echo ok")["stdout"] == "ok\n"


# -- huge bodies ----------------------------------------------------------------------------------


def test_router_huge_bodies_are_413(c, sid):
    filler = json.dumps({"metadata": {"k": "v" * (2 * MIB)}}).encode()
    assert code(c.post("/v1/sandboxes", content=filler, headers=JSON)) == "PAYLOAD_TOO_LARGE"
    assert code(c.post(_path("keepalive", sid), content=filler, headers=JSON)) == (
        "PAYLOAD_TOO_LARGE"
    )
    big_exec = json.dumps({"command": "true", "stdin": "x" * (9 * MIB)}).encode()
    r = c.post(_path("exec", sid), content=big_exec, headers=JSON)
    assert _bad(r, 413)["code"] == "PAYLOAD_TOO_LARGE"

    def chunks(n: int) -> Iterator[bytes]:  # no Content-Length: refused on the way
        for _ in range(n):
            yield b" " * MIB

    r = c.post("/v1/sandboxes", content=chunks(4), headers=JSON)
    assert _bad(r, 413)["code"] == "PAYLOAD_TOO_LARGE"
    started = time.monotonic()
    r = c.put(f"/v1/sandboxes/{sid}/files", params={"path": "big"}, content=chunks(200))
    assert _bad(r, 413)["code"] == "PAYLOAD_TOO_LARGE"  # the template's 128 MB disk quota
    assert time.monotonic() - started < 30
    names = [e["name"] for e in c.get(f"/v1/sandboxes/{sid}/files/list").json()["entries"]]
    assert "big" not in names and not any("sandcell-upload" in n for n in names), names
    _still_serving(c, sid)


def test_declared_but_absent_body_does_not_hang(server, key, sid):
    """Content-Length promises more than is sent, then the client goes quiet or leaves."""
    request = (
        f"POST /v1/sandboxes/{sid}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"command": '
    ).encode()
    answer = raw_http(server.url, request, half_close=True, timeout_s=15)
    assert answer.status in (None, 400), answer
    with server.client(key) as c:
        _still_serving(c, sid)


@pytest.mark.parametrize("length", ["-1", "abc", "1e3", "10, 20", "99999999999999999999999"])
def test_broken_content_length_is_refused(server, key, length):
    request = (
        f"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
        "Connection: close\r\n\r\n{}"
    ).encode()
    answer = raw_http(server.url, request)
    assert answer.status in (None, 400, 413), answer


# -- huge headers -------------------------------------------------------------------------------


@pytest.mark.slow
def test_huge_and_many_headers_do_not_break_the_router(server, c, sid):
    before = rss_bytes(server.proc.pid)
    for headers in (
        {"x-big": "a" * MIB},
        [(f"x-h{i}", "v") for i in range(10_000)],
        {"x-request-id": "r" * 100_000},
    ):
        try:
            r = c.get("/v1/sandboxes", headers=headers)
        except httpx.RemoteProtocolError:
            continue  # refused at the HTTP layer: fine
        assert r.status_code < 500, r.text[:200]
        assert len(r.headers.get("x-request-id", "")) <= 128
    transport = httpx.HTTPTransport(local_address="127.0.0.8")  # a failed login of its own
    with httpx.Client(base_url=server.url, transport=transport, timeout=30) as other:
        r = other.get("/v1/sandboxes", headers={"authorization": "Bearer " + "k" * 60_000})
        assert r.status_code == 401 and code(r) == "UNAUTHENTICATED"
        try:  # past the head limit: refused before anyone looks at the key
            r = other.get("/v1/sandboxes", headers={"authorization": "Bearer " + "k" * MIB})
        except httpx.RemoteProtocolError:
            pass
        else:
            assert r.status_code == 431 and code(r) == "BAD_REQUEST"
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"}, headers={"x-big": "a" * MIB})
    assert r.status_code < 500
    _still_serving(c, sid)
    assert rss_bytes(server.proc.pid) - before < 64 * MIB


def test_absurd_headers_are_refused(server):
    with server.client() as anonymous:
        try:
            r = anonymous.get("/healthz", headers={"x-big": "a" * (32 * MIB)})
        except httpx.TransportError:
            return  # closed after the 431 while the client was still sending
    assert r.status_code == 431, r.status_code


def test_slow_clients_do_not_starve_the_router(server, c, sid):
    """200 connections that send half a request line and wait: others are still served."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    held = []
    try:
        for _ in range(200):
            s = socket.create_connection((host, int(port)), 5)
            s.sendall(b"GET /v1/sandb")
            held.append(s)
        started = time.monotonic()
        _still_serving(c, sid)
        assert time.monotonic() - started < 2
    finally:
        for s in held:
            s.close()


# -- invalid UTF-8 and path tricks --------------------------------------------------------------


def test_invalid_utf8_in_paths_queries_and_headers(server, key, c, sid):
    base = f"/v1/sandboxes/{sid}"
    assert _bad(c.get("/v1/sandboxes/%ff%fe"), 404)["code"] == "SANDBOX_NOT_FOUND"
    assert _bad(c.get(f"{base}/files?path=%ff%fe"), 404)["code"] == "FILE_NOT_FOUND"
    assert _bad(c.get(f"{base}/files/stat?path=a%00b"), 400)["code"] == "BAD_REQUEST"
    r = c.put(f"{base}/files?path=%c3%28", content=b"x")  # an invalid two-byte sequence
    assert r.status_code in (200, 400), r.text
    for raw in (
        b"GET /v1/sandboxes/\xff\xfe HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + key.encode()
        + b"\r\nConnection: close\r\n\r\n",
        b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"Authorization: Bearer \xff\xfe\r\n\r\n",
        f"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n".encode()
        + b"X-Request-Id: \xff\xfe\r\nConnection: close\r\n\r\n",
    ):
        answer = raw_http(server.url, raw, local_address="127.0.0.9")
        assert answer.status is not None and answer.status < 500, answer
    _still_serving(c, sid)


# Raw request targets (sent as is, no client-side normalisation) that must not reach anything
# but the sandbox's own /v1 API, and must not leave the workspace.
ESCAPES = [
    "/v1/sandboxes/{sid}/../../healthz",
    "/v1/sandboxes/{sid}/%2e%2e/init",
    "/v1/sandboxes/{sid}/..%2finit",
    "/v1/sandboxes/{sid}/%2e%2e%2f%2e%2e%2finit",
    "/v1/sandboxes/{sid}//init",
    "/v1/sandboxes/{sid}/%2F..%2F..%2Fhealth",
    "/v1/sandboxes/..%2f..%2fhealthz",
    "/v1/sandboxes/{sid}/files?path=../../etc/passwd",
    "/v1/sandboxes/{sid}/files?path=/etc/passwd",
    "/v1/sandboxes/{sid}/files?path=%2Fetc%2Fpasswd",
    "/v1/sandboxes/{sid}/files?path=..%2F..%2F..%2Fetc%2Fpasswd",
    "/v1/sandboxes/{sid}/files?path=sub/../../etc/passwd",
    "/v1/sandboxes/{sid}/files?path=root/etc/passwd",
    "/v1/sandboxes/{sid}/files?path=/proc/self/root/etc/passwd",
    "/v1/sandboxes/{sid}/files?path=/workspace/../etc/passwd",
    "/v1/sandboxes/{sid}/files?path=sub/a.txt&path=/etc/passwd",
    "/v1/sandboxes/{sid}/files/list?path=root",
    "/v1/sandboxes/{sid}/files/list?path=..",
    "/v1/sandboxes/{sid}/files/stat?path=root/etc",
]


@pytest.mark.parametrize("target", ESCAPES)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_path_tricks_stay_in_the_sandbox(server, key, sid, target, method):
    target = target.format(sid=sid)
    body = b'{"token": "x", "path": "../../x", "from": "sub/a.txt", "to": "../../x"}'
    request = (
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    answer = raw_http(server.url, request)
    assert answer.status is not None and 400 <= answer.status < 500, answer
    assert HOST_SECRET.encode() not in answer.body
    assert b"initialized" not in answer.body and b'"status"' not in answer.body, answer.body
    error = json.loads(answer.body)["error"]
    assert error["code"] in {
        "NOT_FOUND",
        "FORBIDDEN",
        "METHOD_NOT_ALLOWED",
        "BAD_REQUEST",
        "SANDBOX_NOT_FOUND",
        "FILE_NOT_FOUND",
    }, error


def test_file_operations_through_escaping_links_are_forbidden(c, sid):
    base = f"/v1/sandboxes/{sid}"
    attempts = [
        c.get(f"{base}/files", params={"path": "pw"}),
        c.get(f"{base}/files", params={"path": "root/etc/passwd"}),
        c.put(f"{base}/files", params={"path": "root/tmp/planted"}, content=b"x"),
        c.post(f"{base}/files/mkdir", json={"path": "root/tmp/newdir"}),
        c.post(f"{base}/files/move", json={"from": "sub/a.txt", "to": "root/tmp/moved"}),
        c.post(f"{base}/files/move", json={"from": "root/etc/hostname", "to": "stolen"}),
        c.delete(f"{base}/files", params={"path": "root/etc/hostname"}),
        c.delete(f"{base}/files", params={"path": "."}),
        c.delete(f"{base}/files", params={"path": "..", "recursive": "true"}),
    ]
    for r in attempts:
        assert _bad(r, 403)["code"] == "FORBIDDEN", r.text
    assert c.get(f"{base}/files", params={"path": "sub/a.txt"}).text == "hello\n"
    # The link itself lives in the workspace: removing it is fine, its target is untouched.
    assert c.delete(f"{base}/files", params={"path": "pw"}).status_code == 204
    r = c.post(f"{base}/exec", json={"command": "head -c 4 /etc/passwd && ln -s /etc/passwd pw"})
    assert r.json()["stdout"] == "root", r.text


def _raw(server: RunningServer, key: str, method: str, target: str, body: bytes = b""):
    return raw_http(
        server.url,
        (
            f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        + body,
    )


def test_dot_segments_cannot_reach_the_daemon_outside_v1(server, key, sid):
    from sandcell import tokens

    bootstrap, _ = server_keys(server, sid)
    valid = tokens.mint_bootstrap_token(bootstrap, sid, tokens.public_pem(tokens.generate_p256()))
    seen = {
        "health": _raw(server, key, "GET", f"/v1/sandboxes/{sid}/a/../../health"),
        "openapi": _raw(server, key, "GET", f"/v1/sandboxes/{sid}/files/../../openapi.json"),
        "init": _raw(
            server,
            key,
            "POST",
            f"/v1/sandboxes/{sid}/exec/../../init",
            json.dumps({"token": valid}).encode(),
        ),
    }
    reached = {name: a.status for name, a in seen.items() if a.status not in (400, 404)}
    assert reached == {}, {name: seen[name].body[:120] for name in reached}


def test_encoded_slash_after_the_sandbox_id_is_not_a_500(server, key, sid):
    answer = _raw(server, key, "GET", f"/v1/sandboxes/{sid}%2f..%2f..%2finit")
    assert answer.status is not None and answer.status < 500, answer


def test_nan_timeout_is_400(c, sid):
    body = b'{"command": "true", "timeout_s": NaN}'
    assert _bad(c.post(_path("exec", sid), content=body, headers=JSON), 400)


def test_reading_a_socket_file_is_a_clean_error(c, sid):
    base = f"/v1/sandboxes/{sid}"
    make = "import socket; socket.socket(socket.AF_UNIX).bind('sock')"
    r = c.post(f"{base}/exec", json={"command": ["python3", "-c", make]})
    assert r.json()["exit_code"] == 0, r.text
    try:
        r = c.get(f"{base}/files", params={"path": "sock"})
        assert _bad(r, 400)["code"] == "BAD_REQUEST"
    finally:
        c.delete(f"{base}/files", params={"path": "sock"})


def test_the_bare_daemon_answers_bad_targets_cleanly(daemon):
    with daemon.client() as d:
        for target in (
            "/v1/files?path=%ff",
            "/v1/files?path=..%2F..",
            "/v1/files/list?depth=-1",
            "/v1/files/list?depth=99999999999999999999",
            "/v1/files?path=",
        ):
            r = d.signed_request("GET", target)
            assert 400 <= r.status_code < 500, (target, r.text)
            assert_error_shape(r)
        assert d.exec("echo ok")["stdout"] == "ok\n"
    assert Path(daemon.workspace).is_dir()
