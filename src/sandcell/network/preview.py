"""Preview URLs: signed, expiring tokens naming one sandbox and one port (SPEC §11).

A token is `<sandbox id>.<port>.<expiry>.<mac>`, the MAC an HMAC-SHA256 under a server key kept
sealed in the store (so every replica accepts every replica's tokens). It needs no API key: it
is the credential. It dies with the sandbox because the router looks the sandbox up on every
request, and sandbox ids are never reused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import time

PREVIEW_KEY_NAME = "preview-url-key"
MAX_EXPIRES_IN_S = 7 * 86_400
_TOKEN = re.compile(r"^(sbx-[0-9a-f]{1,64})\.(\d{1,5})\.(\d{1,12})\.([A-Za-z0-9_-]{43})$")


def new_key() -> bytes:
    return os.urandom(32)


class PreviewSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, payload: str) -> str:
        digest = hmac.new(self._key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def mint(self, sandbox_id: str, port: int, expires_at: int) -> str:
        payload = f"{sandbox_id}.{port}.{expires_at}"
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float | None = None) -> tuple[str, int] | None:
        """(sandbox id, port) for a genuine, unexpired token; None for anything else."""
        m = _TOKEN.match(token)
        if m is None:
            return None
        sandbox_id, port, expires_at, mac = m.groups()
        if not hmac.compare_digest(mac, self._mac(f"{sandbox_id}.{port}.{expires_at}")):
            return None
        if int(expires_at) <= (time.time() if now is None else now):
            return None
        return sandbox_id, int(port)
