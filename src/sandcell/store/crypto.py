"""The store key, sealing of secrets at rest, and API key hashing."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import secrets
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_ENV = "SANDCELL_STORE_KEY"
KEY_FILE = "store.key"
KEY_BYTES = 32

_VERSION = b"\x01"  # first byte of every sealed blob, so the format can change later
_NONCE_BYTES = 12
_TAG_BYTES = 16


class StoreCryptoError(Exception):
    """The store key is unusable, or a sealed value cannot be opened (wrong key, AAD or bytes)."""


def _decode_key(text: str, source: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise StoreCryptoError(
            f"{source} must be the base64 encoding of exactly {KEY_BYTES} random bytes "
            "(e.g. `openssl rand -base64 32`)"
        )
    return key


def _read_key_file(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise StoreCryptoError(f"cannot read store key file {path}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise StoreCryptoError(f"store key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise StoreCryptoError(
                f"store key file {path} is accessible by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run `chmod 600 {path}`"
            )
        return _decode_key(f.read().decode("ascii", "replace"), f"store key file {path}")


def _create_key_file(path: Path) -> None:
    """Publish a new key file whole: written to a private temp file, then hard-linked into place.

    The link fails if another process won the race, so no reader ever sees a half-written key
    and two replicas starting together end up sharing the winner's key.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64encode(os.urandom(KEY_BYTES)) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink()


def load_store_key(data_dir: Path) -> bytes:
    """Return the 32-byte store key from `SANDCELL_STORE_KEY`, else from `<data_dir>/store.key`.

    The file is created (mode 0600) on first start; an existing one readable by anyone else is
    refused rather than silently trusted.
    """
    if (value := os.environ.get(KEY_ENV)) is not None:
        return _decode_key(value, KEY_ENV)
    path = Path(data_dir) / KEY_FILE
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        _create_key_file(path)
    return _read_key_file(path)


class Sealer:
    """AES-256-GCM with a random 96-bit nonce: `version || nonce || ciphertext+tag`.

    The AAD binds a blob to where it belongs (e.g. its sandbox id), so a blob copied elsewhere
    does not open.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise StoreCryptoError(f"store key must be {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return _VERSION + nonce + self._aead.encrypt(nonce, plaintext, aad)

    def open(self, blob: bytes, aad: bytes) -> bytes:
        if len(blob) < 1 + _NONCE_BYTES + _TAG_BYTES or blob[:1] != _VERSION:
            raise StoreCryptoError("sealed value is truncated or of an unknown format")
        nonce, body = blob[1 : 1 + _NONCE_BYTES], blob[1 + _NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, body, aad)
        except InvalidTag:
            raise StoreCryptoError(
                "sealed value does not open: wrong store key, or the value was altered or "
                "moved to another record"
            ) from None


def hash_api_key(key: str) -> str:
    """SHA-256 hex: API keys are 256-bit random tokens, so a slow password hash buys nothing."""
    return hashlib.sha256(key.encode()).hexdigest()


SANDCELL_KEY_PREFIX = "sc_"
E2B_KEY_PREFIX = "e2b_"
E2B_KEY_HEX_DIGITS = 40  # E2B's own key length: 160 random bits


def new_api_key(*, e2b: bool = False) -> str:
    """A fresh key: `sc_` and 256 random bits, or with `e2b` one shaped as E2B's own
    (`e2b_` and 40 hex digits), which every e2b SDK's format check lets through as it is."""
    if not e2b:
        return SANDCELL_KEY_PREFIX + secrets.token_urlsafe(32)
    while True:
        key = E2B_KEY_PREFIX + secrets.token_hex(E2B_KEY_HEX_DIGITS // 2)
        # Never one that reads as a hex-encoded `sc_` key, the other `e2b_` form the façade takes.
        if not key.startswith(E2B_KEY_PREFIX + SANDCELL_KEY_PREFIX.encode().hex()):
            return key
