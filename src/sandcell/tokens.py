"""Minting and verifying the two JWTs that bind a daemon to its sandbox (SPEC §2.1).

* The bootstrap token: signed by the manager's bootstrap key, carries the per-sandbox session
  public key to `POST /init`.
* Request tokens: signed by the session key, one per proxied request, bound to the method,
  the path with its query string and (when buffered) the body.

Signatures are `sandcell.jws`'s: the algorithm follows from the key type, never from the
token, so `none`, HS* and any algorithm swap are refused by construction. The claims are
checked here, each one PyJWT would check and the ones it does not (lifetime, jti).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sandcell import jws
from sandcell.jws import PrivateKey, PublicKey, algorithm_for

MANAGER_ISSUER = "sandcell-manager"
ROUTER_ISSUER = "sandcell-router"
DAEMON_AUDIENCE = "sandcell-daemon"
BOOTSTRAP_MAX_TTL_S = 120
REQUEST_MAX_TTL_S = 300
LEEWAY_S = 30

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
    return jws.sign(payload, key)


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
        claims = jws.verify(token, key)
    except jws.JWSError as exc:
        raise TokenError(str(exc)) from exc
    if missing := [name for name in required if claims.get(name) is None]:
        raise TokenError(f"token is missing the {missing[0]!r} claim")
    if claims["aud"] != DAEMON_AUDIENCE:  # one string: a list is refused (strict)
        raise TokenError("invalid audience")
    if claims["iss"] != issuer:
        raise TokenError("invalid issuer")
    if not isinstance(claims["sub"], str):
        raise TokenError("sub must be a string")
    _check_times(claims, max_ttl_s)
    if not isinstance(claims["jti"], str) or not claims["jti"]:
        raise TokenError("jti must be a non-empty string")
    return claims


def _check_times(claims: dict[str, Any], max_ttl_s: int) -> None:
    iat, exp, nbf = claims["iat"], claims["exp"], claims.get("nbf", 0)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (iat, exp, nbf)):
        raise TokenError("iat, exp and nbf must be numbers")
    now = time.time()
    if exp <= now - LEEWAY_S:
        raise TokenError("token has expired")
    if iat > now + LEEWAY_S:
        raise TokenError("token issued in the future")
    if nbf > now + LEEWAY_S:
        raise TokenError("token not yet valid (nbf)")
    if exp - iat > max_ttl_s:
        raise TokenError(f"token lifetime exceeds {max_ttl_s} s")


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
