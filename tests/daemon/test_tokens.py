"""Token minting and verification, in-process: every claim, every algorithm trick."""

from __future__ import annotations

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sandcell import tokens

SBX = "sbx-1"


@pytest.fixture(scope="module")
def key() -> tokens.PrivateKey:
    return tokens.generate_p256()


def _claims(**over: object) -> dict:
    now = int(time.time())
    base = {
        "iss": tokens.ROUTER_ISSUER,
        "aud": tokens.DAEMON_AUDIENCE,
        "sub": SBX,
        "iat": now,
        "exp": now + 60,
        "jti": "j1",
        "htm": "POST",
        "htu": "/v1/exec",
        "bsh": tokens.body_hash(b"{}"),
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def _verify(token: str, key: tokens.PrivateKey, body: bytes | None = b"{}") -> None:
    tokens.verify_request_token(token, key.public_key(), SBX, "POST", "/v1/exec", body, True)


def test_round_trip(key):
    token = tokens.mint_request_token(key, SBX, "post", "/v1/exec", b"{}")
    _verify(token, key)


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"aud": "someone-else"}, "audience"),
        ({"iss": tokens.MANAGER_ISSUER}, "issuer"),
        ({"exp": int(time.time()) - 120, "iat": int(time.time()) - 180}, "expired"),
        ({"iat": int(time.time()) + 600, "exp": int(time.time()) + 660}, "future"),
        ({"exp": int(time.time()) + 3600}, "lifetime"),
        ({"jti": None}, "jti"),
        ({"htm": None}, "htm"),
        ({"htm": "GET"}, "method"),
        ({"htu": "/v1/files?path=x"}, "path"),
        ({"sub": "sbx-other"}, "sandbox"),
        ({"bsh": tokens.body_hash(b"{ }")}, "body"),
        ({"bsh": None}, "bsh"),
        ({"jti": 7}, "jti"),
    ],
)
def test_bad_claims_rejected(key, claims, why):
    token = jwt.encode(_claims(**claims), key, algorithm="ES256")
    with pytest.raises(tokens.TokenError):
        _verify(token, key)


def test_alg_none_rejected(key):
    token = jwt.encode(_claims(), None, algorithm="none")
    with pytest.raises(tokens.TokenError):
        _verify(token, key)


def test_hs256_signed_with_public_key_rejected(key):
    """The classic confusion: HMAC keyed with the verifier's public key PEM."""
    import base64
    import hashlib
    import hmac
    import json

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64(json.dumps(_claims()).encode())
    mac = hmac.new(tokens.public_pem(key), header + b"." + payload, hashlib.sha256).digest()
    token = (header + b"." + payload + b"." + b64(mac)).decode()
    with pytest.raises(tokens.TokenError):
        _verify(token, key)


def test_other_key_rejected(key):
    token = jwt.encode(_claims(), tokens.generate_p256(), algorithm="ES256")
    with pytest.raises(tokens.TokenError):
        _verify(token, key)


def test_es384_rejected_for_p256_key(key):
    other = ec.generate_private_key(ec.SECP384R1())
    token = jwt.encode(_claims(), other, algorithm="ES384")
    with pytest.raises(tokens.TokenError):
        _verify(token, key)


def test_rsa_pins_rs256():
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert tokens.algorithm_for(rsa_key) == "RS256"
    token = tokens.mint_bootstrap_token(rsa_key, SBX, tokens.public_pem(tokens.generate_p256()))
    assert tokens.verify_bootstrap_token(token, rsa_key.public_key(), SBX).claims["sub"] == SBX
    ps = jwt.encode(jwt.decode(token, options={"verify_signature": False}), rsa_key, "PS256")
    with pytest.raises(tokens.TokenError):
        tokens.verify_bootstrap_token(ps, rsa_key.public_key(), SBX)


def test_weak_keys_refused():
    with pytest.raises(ValueError, match="P-256"):
        tokens.algorithm_for(ec.generate_private_key(ec.SECP256K1()))
    with pytest.raises(ValueError, match="2048"):
        tokens.algorithm_for(rsa.generate_private_key(public_exponent=65537, key_size=1024))


def test_bootstrap_subject_mismatch_is_distinct(key):
    token = tokens.mint_bootstrap_token(key, "sbx-a", tokens.public_pem(tokens.generate_p256()))
    with pytest.raises(tokens.SubjectMismatch):
        tokens.verify_bootstrap_token(token, key.public_key(), "sbx-b")


def test_bootstrap_lifetime_capped(key):
    now = int(time.time())
    claims = {
        "iss": tokens.MANAGER_ISSUER,
        "aud": tokens.DAEMON_AUDIENCE,
        "sub": SBX,
        "iat": now,
        "exp": now + 121,
        "jti": "x",
        "session_public_key": "pem",
    }
    with pytest.raises(tokens.TokenError, match="lifetime"):
        tokens.verify_bootstrap_token(jwt.encode(claims, key, "ES256"), key.public_key(), SBX)


def test_streamed_body_digest(key):
    import hashlib

    token = tokens.mint_request_token(key, SBX, "PUT", "/v1/files?path=a", b"data")
    verified = tokens.verify_request_token(
        token, key.public_key(), SBX, "PUT", "/v1/files?path=a", None, False
    )
    tokens.check_streamed_body(verified, hashlib.sha256(b"data").digest())
    with pytest.raises(tokens.TokenError):
        tokens.check_streamed_body(verified, hashlib.sha256(b"tampered").digest())
