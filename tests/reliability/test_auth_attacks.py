"""The daemon's JWT attack matrix run again through the router, and API key guessing.

Three vantage points: a user at the router's edge (presenting tokens instead of an API key, or
smuggling them beside one); the untrusted code inside a cell, which can reach its own daemon's
socket and tries every forgery on it; and the host, replaying one sandbox's token on another.
Tokens signed with the real keys (read from the store, as a thief would have them) are in the
matrix too: they prove the channel works, so each refusal means something.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from reliability.harness import assert_error_shape, cell_of, server_keys, servers
from sandcell import tokens
from support.server import SMALL_TEMPLATE, RunningServer

EXEC_BODY = b'{"command": "echo pwned"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with servers(tmp_path_factory.mktemp("auth")) as fleet:
        yield fleet.start("data", config_text=SMALL_TEMPLATE.format(warm_pool=0))


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.create_key("alice")


@pytest.fixture(scope="module")
def sandboxes(server: RunningServer, key: str) -> Iterator[list[str]]:
    with server.client(key) as c:
        ids = []
        for _ in range(2):
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        yield ids
        for sid in ids:
            c.delete(f"/v1/sandboxes/{sid}")


def _client(server: RunningServer, source: str, authorization: str | None = None) -> httpx.Client:
    """A client from its own loopback address: failed guesses are counted per address."""
    headers = {"authorization": authorization} if authorization else {}
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=server.url, transport=transport, headers=headers, timeout=30)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256(claims: dict, secret: bytes) -> str:
    header = _b64(b'{"alg":"HS256","typ":"JWT"}')
    signing = f"{header}.{_b64(json.dumps(claims).encode())}"
    mac = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{_b64(mac)}"


def request_claims(sid: str, body: bytes = EXEC_BODY, **over: object) -> dict:
    now = int(time.time())
    claims = {
        "iss": tokens.ROUTER_ISSUER,
        "aud": tokens.DAEMON_AUDIENCE,
        "sub": sid,
        "iat": now,
        "exp": now + 60,
        "jti": f"j-{time.monotonic_ns()}",
        "htm": "POST",
        "htu": "/v1/exec",
        "bsh": tokens.body_hash(body),
    }
    claims.update(over)
    return {k: v for k, v in claims.items() if v is not None}


def request_forgeries(sid: str, session: tokens.PrivateKey) -> dict[str, str]:
    """Every way to get a request token wrong, each otherwise valid for POST /v1/exec."""
    now = int(time.time())

    def signed(**over: object) -> str:
        return jwt.encode(request_claims(sid, **over), session, algorithm="ES256")

    return {
        "alg-none": jwt.encode(request_claims(sid), None, algorithm="none"),
        "hs256-keyed-with-public-pem": _hs256(request_claims(sid), tokens.public_pem(session)),
        "other-p256-key": jwt.encode(request_claims(sid), tokens.generate_p256(), "ES256"),
        "es384": jwt.encode(request_claims(sid), ec.generate_private_key(ec.SECP384R1()), "ES384"),
        "expired": signed(iat=now - 400, exp=now - 100),
        "issued-in-the-future": signed(iat=now + 600, exp=now + 660),
        "lifetime-too-long": signed(exp=now + 3600),
        "wrong-audience": signed(aud="sandcell-router"),
        "wrong-issuer": signed(iss=tokens.MANAGER_ISSUER),
        "other-sandbox": signed(sub="sbx-someone-else"),
        "other-method": signed(htm="GET"),
        "other-path": signed(htu="/v1/files?path=x"),
        "no-body-binding": signed(bsh=None),
        "other-body": signed(bsh=tokens.body_hash(b'{"command": "true"}')),
        "no-jti": signed(jti=None),
        "numeric-jti": signed(jti=7),
        "garbage": "not.a.jwt",
        "empty": "",
    }


def bootstrap_forgeries(sid: str, bootstrap: tokens.PrivateKey) -> dict[str, str]:
    now = int(time.time())
    pem = tokens.public_pem(tokens.generate_p256()).decode()
    base = {
        "iss": tokens.MANAGER_ISSUER,
        "aud": tokens.DAEMON_AUDIENCE,
        "sub": sid,
        "iat": now,
        "exp": now + 60,
        "session_public_key": pem,
    }

    def signed(**over: object) -> str:
        claims = {**base, "jti": f"b-{time.monotonic_ns()}", **over}
        return jwt.encode(claims, bootstrap, algorithm="ES256")

    return {
        "other-p256-key": jwt.encode({**base, "jti": "b1"}, tokens.generate_p256(), "ES256"),
        "alg-none": jwt.encode({**base, "jti": "b2"}, None, algorithm="none"),
        "hs256-keyed-with-public-pem": _hs256({**base, "jti": "b3"}, tokens.public_pem(bootstrap)),
        "expired": signed(iat=now - 400, exp=now - 300),
        "lifetime-too-long": signed(exp=now + 3600),
        "wrong-audience": signed(aud="sandcell-router"),
        "wrong-issuer": signed(iss=tokens.ROUTER_ISSUER),
        "bad-session-key": signed(session_public_key="not a pem"),
        "garbage": "a.b.c",
    }


# -- 1. at the router's edge --------------------------------------------------------------------


def test_tokens_are_not_api_keys(server, key, sandboxes, figures):
    """Any JWT, forged or genuinely signed, presented to the router instead of an API key."""
    sid = sandboxes[0]
    bootstrap, session = server_keys(server, sid)
    presented = {
        **{f"request/{k}": v for k, v in request_forgeries(sid, session).items()},
        **{f"bootstrap/{k}": v for k, v in bootstrap_forgeries(sid, bootstrap).items()},
        "request/genuine": tokens.mint_request_token(
            session, sid, "POST", f"/v1/sandboxes/{sid}/exec", EXEC_BODY
        ),
        "bootstrap/genuine": tokens.mint_bootstrap_token(
            bootstrap, sid, tokens.public_pem(tokens.generate_p256())
        ),
    }
    presented = {name: token for name, token in presented.items() if token}  # "" is no header
    for n, (name, token) in enumerate(presented.items()):
        with _client(server, f"127.0.1.{n + 1}", f"Bearer {token}") as c:
            for r in (
                c.post(f"/v1/sandboxes/{sid}/exec", content=EXEC_BODY),
                c.get("/v1/sandboxes"),
            ):
                assert r.status_code == 401, (name, r.text)
                assert assert_error_shape(r)["code"] == "UNAUTHENTICATED"
    with server.client(key) as c:
        assert c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 200
    figures["auth: tokens presented as API keys"] = {"tried": len(presented), "accepted": 0}


def test_smuggled_tokens_change_nothing(server, key, sandboxes):
    sid = sandboxes[0]
    _, session = server_keys(server, sid)
    genuine = tokens.mint_request_token(session, sid, "POST", "/v1/exec", EXEC_BODY)
    with _client(server, "127.0.2.1") as c:
        # A second Authorization behind the API key, and the usual proxy headers: the router
        # signs its own token and forwards none of these as credentials.
        r = c.post(
            f"/v1/sandboxes/{sid}/exec",
            content=b'{"command": "echo mine"}',
            headers=[
                ("authorization", f"Bearer {key}"),
                ("authorization", f"Bearer {genuine}"),
                ("proxy-authorization", f"Bearer {genuine}"),
                ("x-forwarded-authorization", f"Bearer {genuine}"),
                ("content-type", "application/json"),
            ],
        )
        assert r.status_code == 200 and r.json()["stdout"] == "mine\n", r.text
        # The token first and the key second: the token is what is checked, and refused.
        r = c.post(
            f"/v1/sandboxes/{sid}/exec",
            content=EXEC_BODY,
            headers=[("authorization", f"Bearer {genuine}"), ("authorization", f"Bearer {key}")],
        )
        assert r.status_code == 401, r.text


# -- 2. against the daemon's own socket: out of the cell's reach, so played from the host ---------

SENDER = textwrap.dedent(
    """
    import base64, http.client, json, socket, sys, time

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(sys.argv[1])

    results = []
    for attempt in json.load(sys.stdin):
        time.sleep(attempt["pause"])
        conn = Conn("daemon", timeout=10)
        conn.request(attempt["method"], attempt["path"], base64.b64decode(attempt["body"]),
                     attempt["headers"])
        response = conn.getresponse()
        payload = json.loads(response.read() or b"{}")
        results.append([response.status, payload.get("error", {}).get("code"),
                        payload.get("stdout")])
        conn.close()
    print(json.dumps(results))
    """
)


def _attempt(path: str, body: bytes, token: str | None, pause: float = 0.0) -> dict:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return {
        "method": "POST",
        "path": path,
        "body": base64.b64encode(body).decode(),
        "headers": headers,
        "pause": pause,
    }


@pytest.mark.slow
def test_jwt_matrix_from_inside_the_cell(server, key, sandboxes, figures):
    sid, other = sandboxes
    bootstrap, session = server_keys(server, sid)
    _, other_session = server_keys(server, other)
    expected: list[tuple[str, int, str | None]] = []
    attempts: list[dict] = []

    def add(name: str, attempt: dict, status: int, code: str | None) -> None:
        expected.append((name, status, code))
        attempts.append(attempt)

    genuine = tokens.mint_request_token(session, sid, "POST", "/v1/exec", EXEC_BODY)
    add("request/genuine", _attempt("/v1/exec", EXEC_BODY, genuine), 200, None)
    add("request/replayed", _attempt("/v1/exec", EXEC_BODY, genuine), 401, "UNAUTHENTICATED")
    for name, token in request_forgeries(sid, session).items():
        add(f"request/{name}", _attempt("/v1/exec", EXEC_BODY, token), 401, "UNAUTHENTICATED")
    cross = tokens.mint_request_token(other_session, other, "POST", "/v1/exec", EXEC_BODY)
    add("request/other-sandbox-key", _attempt("/v1/exec", EXEC_BODY, cross), 401, "UNAUTHENTICATED")
    add("request/none", _attempt("/v1/exec", EXEC_BODY, None), 401, "UNAUTHENTICATED")

    def init(token: str) -> dict:  # paced under the init bucket (2/s): each answer is its own
        return _attempt("/init", json.dumps({"token": token}).encode(), None, pause=0.55)

    for name, token in bootstrap_forgeries(sid, bootstrap).items():
        if name == "bad-session-key":  # genuinely signed: refused as a second init
            add(f"init/{name}", init(token), 409, "ALREADY_INITIALIZED")
        else:
            add(f"init/{name}", init(token), 401, "UNAUTHENTICATED")
    pem = tokens.public_pem(tokens.generate_p256())
    add(
        "init/other-sandbox",
        init(tokens.mint_bootstrap_token(bootstrap, other, pem)),
        403,
        "FORBIDDEN",
    )
    valid = tokens.mint_bootstrap_token(bootstrap, sid, pem)
    add("init/genuine-second-init", init(valid), 409, "ALREADY_INITIALIZED")
    add("init/replayed", init(valid), 401, "UNAUTHENTICATED")
    flood = [_attempt("/init", b'{"token": "x.y.z"}', None) for _ in range(10)]

    # The socket is the host's (the daemon got its fd): from inside, nothing to connect to.
    probe = "import socket; socket.socket(socket.AF_UNIX).connect('/run/sandcell/daemon.sock')"
    with server.client(key) as c:
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["python3", "-c", probe]})
        assert r.status_code == 200 and "FileNotFoundError" in r.json()["stderr"], r.text
        socket_path = server.data_dir / "cells" / cell_of(server, c, sid) / "run" / "daemon.sock"
    sent = subprocess.run(
        [sys.executable, "-c", SENDER, str(socket_path)],
        input=json.dumps(attempts + flood),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0, sent.stderr
    results = json.loads(sent.stdout)
    answers = results[: len(expected)]
    seen = [
        (n, status, code) for (n, _, _), (status, code, _) in zip(expected, answers, strict=True)
    ]
    assert seen == expected
    assert results[0][2] == "pwned\n"  # the genuine token did run: the channel is real
    flood_statuses = [status for status, _, _ in results[len(expected) :]]
    assert 429 in flood_statuses and set(flood_statuses) <= {401, 429}, flood_statuses
    # The daemon still answers to the router's key, and to nothing planted from inside.
    with server.client(key) as c:
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo still-mine"})
        assert r.status_code == 200 and r.json()["stdout"] == "still-mine\n"
    figures["auth: JWT matrix from inside a cell"] = {
        "request_tokens_tried": sum(1 for n, _, _ in expected if n.startswith("request/")),
        "init_tokens_tried": sum(1 for n, _, _ in expected if n.startswith("init/")),
        "accepted_besides_the_genuine_control": 0,
        "init_flood_statuses": sorted(set(flood_statuses)),
    }


# -- 3. from the host: one sandbox's token on another's daemon -----------------------------------


def test_a_token_for_one_sandbox_never_works_on_another(server, key, sandboxes):
    sid, other = sandboxes
    _, session = server_keys(server, sid)
    with server.client(key) as c:
        other_cell = cell_of(server, c, other)
    socket_path = server.data_dir / "cells" / other_cell / "run" / "daemon.sock"
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://daemon", timeout=10) as d:
        for sub in (sid, other):  # signed with the first sandbox's key, for either id
            token = tokens.mint_request_token(session, sub, "POST", "/v1/exec", EXEC_BODY)
            r = d.post(
                "/v1/exec",
                content=EXEC_BODY,
                headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
            )
            assert r.status_code == 401 and assert_error_shape(r)["code"] == "UNAUTHENTICATED"


# -- 4. guessing API keys -------------------------------------------------------------------------


@pytest.mark.slow
def test_api_key_guessing_is_rate_limited(server, key, figures):
    statuses = []
    with _client(server, "127.0.3.1", "Bearer sc_wrong") as guesser:
        for _ in range(30):
            statuses.append(guesser.get("/v1/sandboxes").status_code)
        limited = guesser.get("/v1/sandboxes")
        retry_after = int(limited.headers["retry-after"])
    assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}, statuses
    assert assert_error_shape(limited)["code"] == "RATE_LIMITED" and retry_after >= 1
    with _client(server, "127.0.3.1", f"Bearer {key}") as same_address:
        # Failures only are slowed: a valid key behind the same address is always served
        # (256-bit keys, not the brake, are what defeats guessing).
        assert same_address.get("/v1/sandboxes").status_code == 200
    with _client(server, "127.0.3.2", f"Bearer {key}") as elsewhere:
        assert elsewhere.get("/v1/sandboxes").status_code == 200
    time.sleep(retry_after + 0.1)
    with _client(server, "127.0.3.1", "Bearer sc_wrong") as guesser:
        after_wait = [guesser.get("/v1/sandboxes").status_code for _ in range(3)]
    assert after_wait == [401, 429, 429], after_wait  # one more guess per 2 s, no more

    # Twenty connections guessing at once get no more than the burst between them.
    counts = {401: 0, 429: 0}
    lock = threading.Lock()
    started = time.monotonic()

    def guess(n: int) -> None:
        with _client(server, "127.0.3.3", f"Bearer sc_guess_{n}") as c:
            for _ in range(10):
                status = c.get("/v1/sandboxes").status_code
                with lock:
                    counts[status] += 1

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    allowed = 10 + 0.5 * (time.monotonic() - started) + 1
    assert counts[401] <= allowed and counts[401] + counts[429] == 200, counts

    # X-Forwarded-For from a client that is no trusted proxy does not reset the count.
    with _client(server, "127.0.3.4", "Bearer sc_wrong") as c:
        rotated = [
            c.get("/v1/sandboxes", headers={"x-forwarded-for": f"10.0.0.{i}"}).status_code
            for i in range(15)
        ]
    assert rotated.count(401) <= 10 and rotated[-1] == 429, rotated
    figures["auth: API key guessing"] = {
        "serial_guesses": len(statuses),
        "serial_401_then_429": [statuses.count(401), statuses.count(429)],
        "parallel_guesses": 200,
        "parallel_401_then_429": [counts[401], counts[429]],
        "xff_rotation_401": rotated.count(401),
    }
