"""Minting and verifying the two JWTs that bind a daemon to its sandbox (SPEC §2.1).

* The bootstrap token: signed by the manager's bootstrap key, carries the per-sandbox session
  public key to `POST /init`.
* Request tokens: signed by the session key, one per proxied request, bound to the method,
  the path with its query string and (when buffered) the body.

The algorithm is never read from the token: it follows from the key type, so `none`, HS*
and any algorithm swap are refused by construction.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

MANAGER_ISSUER = "sandcell-manager"
ROUTER_ISSUER = "sandcell-router"
DAEMON_AUDIENCE = "sandcell-daemon"
BOOTSTRAP_MAX_TTL_S = 120
REQUEST_MAX_TTL_S = 300
LEEWAY_S = 30
MIN_RSA_BITS = 2048

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey

_BOOTSTRAP_CLAIMS = ("iss", "aud", "sub", "iat", "exp", "jti", "session_public_key")
_REQUEST_CLAIMS = ("iss", "aud", "sub", "iat", "exp", "jti", "htm", "htu")


class TokenError(Exception):
    """The token is not acceptable (bad signature, claims, lifetime): a 401."""


class SubjectMismatch(TokenError):
    """A valid token minted for another sandbox: a 403 at init."""


@dataclass(frozen=True)
class VerifiedToken:
    jti: str
    exp: float
    claims: dict[str, Any]


def algorithm_for(key: PrivateKey | PublicKey) -> str:
    """The one algorithm a key may be used with."""
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise ValueError(f"unsupported EC curve {key.curve.name}; use P-256")
        return "ES256"
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"RSA keys must have at least {MIN_RSA_BITS} bits")
        return "RS256"
    raise ValueError(f"unsupported key type {type(key).__name__}")


def generate_p256() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def private_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: PrivateKey | PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_private_key(pem: bytes) -> PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, PrivateKey):
        raise ValueError("not an EC or RSA private key")
    algorithm_for(key)
    return key


def load_public_key(pem: bytes) -> PublicKey:
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, PublicKey):
        raise ValueError("not an EC or RSA public key")
    algorithm_for(key)
    return key


def body_hash(body: bytes) -> str:
    """The `bsh` claim: base64url (unpadded) SHA-256 of the exact body bytes."""
    return encode_digest(hashlib.sha256(body).digest())


def encode_digest(sha256_digest: bytes) -> str:
    return base64.urlsafe_b64encode(sha256_digest).rstrip(b"=").decode()


def check_streamed_body(verified: VerifiedToken, sha256_digest: bytes) -> None:
    """For a body hashed while streaming: it must match `bsh` when the token binds one."""
    bsh = verified.claims.get("bsh")
    if bsh is not None and not secrets.compare_digest(bsh, encode_digest(sha256_digest)):
        raise TokenError("request body does not match the token")


def _mint(key: PrivateKey, claims: dict[str, Any], ttl_s: int) -> str:
    now = int(time.time())
    payload = {"iat": now, "exp": now + ttl_s, "jti": secrets.token_urlsafe(16), **claims}
    return jwt.encode(payload, key, algorithm=algorithm_for(key))


def mint_bootstrap_token(
    key: PrivateKey,
    sandbox_id: str,
    session_public_key_pem: bytes,
    ttl_s: int = 60,
    extra: dict[str, Any] | None = None,
) -> str:
    """`extra` carries signed, non-identity init data (the sandbox's default env)."""
    claims = {
        **(extra or {}),
        "iss": MANAGER_ISSUER,
        "aud": DAEMON_AUDIENCE,
        "sub": sandbox_id,
        "session_public_key": session_public_key_pem.decode(),
    }
    return _mint(key, claims, min(ttl_s, BOOTSTRAP_MAX_TTL_S))


def mint_request_token(
    key: PrivateKey,
    sandbox_id: str,
    method: str,
    path_with_query: str,
    body: bytes | None = None,
    ttl_s: int = 60,
) -> str:
    """`body` is None when the body is streamed (not buffered): then no `bsh` is bound."""
    claims: dict[str, Any] = {
        "iss": ROUTER_ISSUER,
        "aud": DAEMON_AUDIENCE,
        "sub": sandbox_id,
        "htm": method.upper(),
        "htu": path_with_query,
    }
    if body is not None:
        claims["bsh"] = body_hash(body)
    return _mint(key, claims, min(ttl_s, REQUEST_MAX_TTL_S))


def _decode(
    token: str, key: PublicKey, issuer: str, required: tuple[str, ...], max_ttl_s: int
) -> dict[str, Any]:
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=[algorithm_for(key)],
            audience=DAEMON_AUDIENCE,
            issuer=issuer,
            leeway=LEEWAY_S,
            options={"require": list(required), "strict_aud": True},
        )
    except jwt.PyJWTError as exc:
        raise TokenError(str(exc) or type(exc).__name__) from exc
    iat, exp, jti = claims["iat"], claims["exp"], claims["jti"]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (iat, exp)):
        raise TokenError("iat and exp must be numbers")
    if iat > time.time() + LEEWAY_S:
        raise TokenError("token issued in the future")
    if exp - iat > max_ttl_s:
        raise TokenError(f"token lifetime exceeds {max_ttl_s} s")
    if not isinstance(jti, str) or not jti:
        raise TokenError("jti must be a non-empty string")
    return claims


def verify_bootstrap_token(token: str, key: PublicKey, sandbox_id: str) -> VerifiedToken:
    claims = _decode(token, key, MANAGER_ISSUER, _BOOTSTRAP_CLAIMS, BOOTSTRAP_MAX_TTL_S)
    if not isinstance(claims["session_public_key"], str):
        raise TokenError("session_public_key must be a PEM string")
    if claims["sub"] != sandbox_id:
        raise SubjectMismatch("token was minted for another sandbox")
    return VerifiedToken(claims["jti"], float(claims["exp"]), claims)


def verify_request_token(
    token: str,
    key: PublicKey,
    sandbox_id: str,
    method: str,
    path_with_query: str,
    body: bytes | None,
    body_required: bool,
) -> VerifiedToken:
    """Checks every claim and the request binding; `body` None means streamed, not hashed."""
    claims = _decode(token, key, ROUTER_ISSUER, _REQUEST_CLAIMS, REQUEST_MAX_TTL_S)
    if claims["sub"] != sandbox_id:
        raise TokenError("token was minted for another sandbox")
    if claims["htm"] != method.upper():
        raise TokenError("token was minted for another method")
    if claims["htu"] != path_with_query:
        raise TokenError("token was minted for another path")
    bsh = claims.get("bsh")
    if bsh is None and body_required:
        raise TokenError("token does not bind the request body (bsh)")
    if bsh is not None and body is not None and not secrets.compare_digest(bsh, body_hash(body)):
        raise TokenError("request body does not match the token")
    return VerifiedToken(claims["jti"], float(claims["exp"]), claims)
