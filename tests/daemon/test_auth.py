"""Two-stage init and request tokens against a real daemon process (SPEC §2.1)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import httpx
import jwt
import pytest

from sandcell import tokens
from support.daemons import RunningDaemon, launch_daemon


def _code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def test_uninitialised_refuses_v1(fresh_daemon: RunningDaemon):
    with fresh_daemon.client() as c:
        assert c.health()["initialized"] is False
        r = c.signed_request("POST", "/v1/exec", json_body={"command": "true"})
        assert r.status_code == 503 and _code(r) == "NOT_INITIALIZED"


def test_init_then_reinit_is_conflict(fresh_daemon: RunningDaemon):
    fresh_daemon.initialize()
    with fresh_daemon.client() as c:
        assert c.health()["initialized"] is True
        # A valid token for another session key: the key is never replaced.
        other = tokens.generate_p256()
        token = tokens.mint_bootstrap_token(
            fresh_daemon.bootstrap_key, fresh_daemon.sandbox_id, tokens.public_pem(other)
        )
        r = c.init(token)
        assert r.status_code == 409 and _code(r) == "ALREADY_INITIALIZED"
        assert c.exec("echo still-mine")["stdout"] == "still-mine\n"
        with fresh_daemon.client(other) as intruder:
            r = intruder.signed_request("POST", "/v1/exec", json_body={"command": "true"})
            assert r.status_code == 401


def test_bootstrap_replay_rejected(fresh_daemon: RunningDaemon):
    token = fresh_daemon.bootstrap_token()
    with fresh_daemon.client() as c:
        assert c.init(token).status_code == 200
        r = c.init(token)
        assert r.status_code == 401 and "replay" in r.json()["error"]["message"]


def test_bootstrap_for_other_sandbox_is_forbidden(fresh_daemon: RunningDaemon):
    token = tokens.mint_bootstrap_token(
        fresh_daemon.bootstrap_key, "sbx-someone-else", tokens.public_pem(tokens.generate_p256())
    )
    with fresh_daemon.client() as c:
        r = c.init(token)
        assert r.status_code == 403 and _code(r) == "FORBIDDEN"
        assert c.health()["initialized"] is False


@pytest.mark.parametrize(
    "forge",
    [
        "wrong_key",
        "alg_none",
        "hs256_public_key",
        "expired",
        "wrong_aud",
        "wrong_iss",
        "garbage",
        "bad_session_key",
    ],
)
def test_bad_bootstrap_tokens_unauthenticated(fresh_daemon: RunningDaemon, forge: str):
    d = fresh_daemon
    now = int(time.time())
    claims = {
        "iss": tokens.MANAGER_ISSUER,
        "aud": tokens.DAEMON_AUDIENCE,
        "sub": d.sandbox_id,
        "iat": now,
        "exp": now + 60,
        "jti": f"j-{forge}",
        "session_public_key": tokens.public_pem(d.session_key).decode(),
    }
    if forge == "wrong_key":
        token = jwt.encode(claims, tokens.generate_p256(), "ES256")
    elif forge == "alg_none":
        token = jwt.encode(claims, None, "none")
    elif forge == "hs256_public_key":
        token = _hs256(claims, tokens.public_pem(d.bootstrap_key))
    elif forge == "expired":
        token = jwt.encode({**claims, "iat": now - 200, "exp": now - 100}, d.bootstrap_key, "ES256")
    elif forge == "wrong_aud":
        token = jwt.encode({**claims, "aud": "sandcell-router"}, d.bootstrap_key, "ES256")
    elif forge == "wrong_iss":
        token = jwt.encode({**claims, "iss": tokens.ROUTER_ISSUER}, d.bootstrap_key, "ES256")
    elif forge == "bad_session_key":
        token = jwt.encode({**claims, "session_public_key": "not a pem"}, d.bootstrap_key, "ES256")
    else:
        token = "not.a.jwt"
    with d.client() as c:
        r = c.init(token)
        assert r.status_code == 401 and _code(r) == "UNAUTHENTICATED", r.text
        assert c.health()["initialized"] is False


def test_init_rate_limited(fresh_daemon: RunningDaemon):
    with fresh_daemon.client() as c:
        statuses = [c.init("bogus").status_code for _ in range(12)]
        assert statuses[:5] == [401] * 5
        limited = c.init("bogus")
        assert limited.status_code == 429 and _code(limited) == "RATE_LIMITED"
        assert int(limited.headers["retry-after"]) >= 1


def test_init_bad_json(fresh_daemon: RunningDaemon):
    with fresh_daemon.client() as c:
        r = c.http.post("/init", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and _code(r) == "BAD_REQUEST"


def _hs256(claims: dict, secret: bytes) -> str:
    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(json.dumps(claims).encode())
    return (signing + b"." + b64(hmac.new(secret, signing, hashlib.sha256).digest())).decode()


# --- request tokens -----------------------------------------------------------------------


def _request_claims(d: RunningDaemon, body: bytes, **over: object) -> dict:
    now = int(time.time())
    claims = {
        "iss": tokens.ROUTER_ISSUER,
        "aud": tokens.DAEMON_AUDIENCE,
        "sub": d.sandbox_id,
        "iat": now,
        "exp": now + 60,
        "jti": f"r-{time.monotonic_ns()}",
        "htm": "POST",
        "htu": "/v1/exec",
        "bsh": tokens.body_hash(body),
    }
    claims.update(over)
    return claims


def _send(
    d: RunningDaemon, token: str, body: bytes, path: str = "/v1/exec", method: str = "POST"
) -> httpx.Response:
    with d.client() as c:
        return c.http.request(
            method,
            path,
            content=body,
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        )


BODY = json.dumps({"command": "echo pwned"}).encode()


@pytest.mark.parametrize(
    "forge",
    [
        "alg_none",
        "hs256_public_key",
        "wrong_key",
        "expired",
        "future_iat",
        "wrong_aud",
        "wrong_iss",
        "wrong_sub",
        "other_path",
        "other_method",
        "no_bsh",
        "too_long",
    ],
)
def test_request_token_attacks(daemon: RunningDaemon, forge: str):
    d = daemon
    now = int(time.time())
    overrides: dict = {
        "expired": {"iat": now - 200, "exp": now - 100},
        "future_iat": {"iat": now + 300, "exp": now + 360},
        "wrong_aud": {"aud": "sandcell-router"},
        "wrong_iss": {"iss": tokens.MANAGER_ISSUER},
        "wrong_sub": {"sub": "sbx-other"},
        "other_path": {"htu": "/v1/files/mkdir"},
        "other_method": {"htm": "GET"},
        "too_long": {"exp": now + 3600},
    }.get(forge, {})
    claims = _request_claims(d, BODY, **overrides)
    if forge == "no_bsh":
        del claims["bsh"]
    if forge == "alg_none":
        token = jwt.encode(claims, None, "none")
    elif forge == "hs256_public_key":
        token = _hs256(claims, tokens.public_pem(d.session_key))
    elif forge == "wrong_key":
        token = jwt.encode(claims, tokens.generate_p256(), "ES256")
    else:
        token = jwt.encode(claims, d.session_key, "ES256")
    r = _send(d, token, BODY)
    assert r.status_code == 401 and _code(r) == "UNAUTHENTICATED", (forge, r.text)


def test_missing_or_malformed_authorization(daemon: RunningDaemon):
    with daemon.client() as c:
        for header in ({}, {"authorization": "Basic abc"}, {"authorization": "Bearer"}):
            r = c.http.post("/v1/exec", content=BODY, headers=header)
            assert r.status_code == 401 and _code(r) == "UNAUTHENTICATED"


def test_replayed_request_token(daemon: RunningDaemon):
    token = jwt.encode(_request_claims(daemon, BODY), daemon.session_key, "ES256")
    assert _send(daemon, token, BODY).status_code == 200
    r = _send(daemon, token, BODY)
    assert r.status_code == 401 and "replay" in r.json()["error"]["message"]


def test_body_tampered_after_signing(daemon: RunningDaemon):
    token = jwt.encode(_request_claims(daemon, BODY), daemon.session_key, "ES256")
    tampered = json.dumps({"command": "echo tampered"}).encode()
    assert _send(daemon, token, tampered).status_code == 401


def test_query_is_bound(daemon: RunningDaemon):
    (daemon.workspace / "bound.txt").write_text("x")
    (daemon.workspace / "other.txt").write_text("secret")
    claims = _request_claims(daemon, b"", htm="GET", htu="/v1/files?path=bound.txt")
    token = jwt.encode(claims, daemon.session_key, "ES256")
    r = _send(daemon, token, b"", path="/v1/files?path=other.txt", method="GET")
    assert r.status_code == 401


def test_upload_body_bound_when_hashed(daemon: RunningDaemon):
    with daemon.client() as c:
        claims = _request_claims(daemon, b"good", htm="PUT", htu="/v1/files?path=up.txt")
        token = jwt.encode(claims, daemon.session_key, "ES256")
        r = c.http.put(
            "/v1/files?path=up.txt", content=b"evil", headers={"authorization": f"Bearer {token}"}
        )
        assert r.status_code == 401
        assert not (daemon.workspace / "up.txt").exists()


def test_token_for_sandbox_a_fails_on_sandbox_b(daemon: RunningDaemon, tmp_path):
    other = launch_daemon(tmp_path, sandbox_id="sbx-b")
    try:
        other.initialize()
        # Minted by A's router key for A: B holds another session key and another id.
        token = tokens.mint_request_token(
            daemon.session_key, daemon.sandbox_id, "POST", "/v1/exec", BODY
        )
        assert _send(other, token, BODY).status_code == 401
        # Even re-minted with B's id, A's key does not verify on B.
        token = tokens.mint_request_token(daemon.session_key, "sbx-b", "POST", "/v1/exec", BODY)
        assert _send(other, token, BODY).status_code == 401
    finally:
        other.stop()
