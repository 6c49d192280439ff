"""`sandcell.jws` against PyJWT: the same tokens both ways, and nothing looser."""

from __future__ import annotations

import base64
import json

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sandcell import jws, tokens

CLAIMS = {"sub": "sbx-1", "n": 1, "ü": "✓"}


@pytest.fixture(scope="module", params=["p256", "rsa"])
def key(request) -> jws.PrivateKey:
    if request.param == "p256":
        return tokens.generate_p256()
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_interoperates_with_pyjwt(key):
    algorithm = jws.algorithm_for(key)
    ours = jws.sign(CLAIMS, key)
    assert jwt.decode(ours, key.public_key(), algorithms=[algorithm]) == CLAIMS
    assert jws.verify(jwt.encode(CLAIMS, key, algorithm), key.public_key()) == CLAIMS
    header = json.loads(base64.urlsafe_b64decode(ours.split(".")[0] + "=="))
    assert header == {"alg": algorithm, "typ": "JWT"}


def test_es256_signature_is_raw_r_s():
    key = tokens.generate_p256()
    signature = jws.sign(CLAIMS, key).rsplit(".", 1)[1]
    assert len(base64.urlsafe_b64decode(signature + "==")) == 64  # not DER


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t + ".x",  # four segments
        lambda t: t.replace(".", " .", 1),  # outside the alphabet (the stdlib would skip it)
        lambda t: t[:-2],  # truncated signature
        lambda t: "é" + t,
        lambda t: _b64(b"[1]") + t[t.index(".") :],  # header not an object
        lambda t: _b64(b'{"alg":"ES256","crit":["b64"]}') + t[t.index(".") :],
        lambda t: _b64(b"[" * 50_000 + b"]" * 50_000) + t[t.index(".") :],  # past recursion
        lambda t: t[: t.index(".") + 1] + _b64(b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    ],
)
def test_malformed_refused(mangle):
    key = tokens.generate_p256()
    with pytest.raises(jws.JWSError):
        jws.verify(mangle(jws.sign(CLAIMS, key)), key.public_key())


def test_payload_must_be_an_object_without_nan():
    key = tokens.generate_p256()
    for payload in (b"[1]", b'{"exp": NaN}'):
        header = _b64(b'{"alg":"ES256","typ":"JWT"}')
        token = jwt.api_jws.encode(payload, key, "ES256")  # signs arbitrary bytes
        assert token.split(".")[0] == header
        with pytest.raises(jws.JWSError):
            jws.verify(token, key.public_key())


def test_header_algorithm_must_match_the_key():
    key = tokens.generate_p256()
    other = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(jws.JWSError, match="ES256"):
        jws.verify(jwt.encode(CLAIMS, other, "ES384"), key.public_key())
