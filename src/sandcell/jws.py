"""Compact JWS (RFC 7515) with ES256 or RS256, on `cryptography` alone.

The daemon verifies a token per request and a cell starts one daemon per sandbox: PyJWT
would bring its JWK machinery and `cryptography.x509` (~20 ms of every start) for two
algorithms. Tokens are exactly PyJWT's: a sorted `{"alg","typ":"JWT"}` header, compact
JSON, base64url without padding, ES256 signatures as raw r||s (RFC 7518 §3.4).

The algorithm is never taken from the token: it follows from the key, and the header must
name that one algorithm, so `none`, HS256 keyed with a public key and swaps are refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey

MIN_RSA_BITS = 2048
_P256_BYTES = 32
_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")


class JWSError(Exception):
    """Malformed, or not signed by this key with its algorithm."""


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


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(segment: str) -> bytes:
    # Strict: the stdlib decoder would skip characters outside the alphabet.
    if not _SEGMENT.fullmatch(segment) or len(segment) % 4 == 1:
        raise JWSError("invalid base64url segment")
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except binascii.Error as exc:
        raise JWSError("invalid base64url segment") from exc


def _compact(value: dict[str, Any], sort_keys: bool = False) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys).encode()


def sign(claims: dict[str, Any], key: PrivateKey) -> str:
    header = _compact({"alg": algorithm_for(key), "typ": "JWT"}, sort_keys=True)
    signing_input = _b64(header) + b"." + _b64(_compact(claims))
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(_P256_BYTES, "big") + s.to_bytes(_P256_BYTES, "big")
    else:
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return (signing_input + b"." + _b64(signature)).decode()


def _object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, NaN/Infinity
        raise JWSError(f"invalid {what}: {exc}") from exc
    except RecursionError:  # nested deeper than the parser recurses: no token's shape
        raise JWSError(f"invalid {what}: nested too deeply") from None
    if not isinstance(value, dict):
        raise JWSError(f"invalid {what}: not a JSON object")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def verify(token: str, key: PublicKey) -> dict[str, Any]:
    """The token's claims once its signature checks out with `key`'s one algorithm."""
    if not token.isascii() or token.count(".") != 2:
        raise JWSError("not a compact JWS")
    header_b64, payload_b64, signature_b64 = token.split(".")
    header = _object(_unb64(header_b64), "header")
    algorithm = algorithm_for(key)
    if header.get("alg") != algorithm:
        raise JWSError(f"the algorithm must be {algorithm}")
    if "crit" in header:  # no extension is understood here (RFC 7515 §4.1.11)
        raise JWSError("unsupported critical header")
    signing_input = f"{header_b64}.{payload_b64}".encode()
    _check_signature(key, signing_input, _unb64(signature_b64))
    return _object(_unb64(payload_b64), "payload")


def _check_signature(key: PublicKey, signing_input: bytes, signature: bytes) -> None:
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            if len(signature) != 2 * _P256_BYTES:
                raise JWSError("signature verification failed")
            r = int.from_bytes(signature[:_P256_BYTES], "big")
            s = int.from_bytes(signature[_P256_BYTES:], "big")
            der = encode_dss_signature(r, s)
            key.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature as exc:
        raise JWSError("signature verification failed") from exc
