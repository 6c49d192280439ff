"""`envdAccessToken`: a per-sandbox credential, minted at create (and at each connect),
checked on every in-sandbox call, and kept nowhere.

A token is `<nonce>.<mac>`, the MAC an HMAC-SHA256 of the sandbox id and the nonce under a
server key kept sealed in the store (so every replica accepts every replica's tokens). A
check recomputes the MAC: nothing per token or per sandbox is stored, so nothing of a
deleted sandbox's tokens stays behind, and a token for one sandbox never opens another. It
dies with its sandbox: the sandbox is looked up on every call, and ids are never reused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets

from sandcell.store import Store

KEY_NAME = "e2b-envd-token-key"
_TOKEN = re.compile(r"\A([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})\Z")


class AccessTokens:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._key: bytes | None = None

    async def _mac(self, sandbox_id: str, nonce: str) -> str:
        if self._key is None:  # one key for every replica, made by whichever asks first
            self._key = await self.store.put_secret_if_absent(KEY_NAME, os.urandom(32))
        payload = f"e2b-envd:{sandbox_id}:{nonce}".encode()
        digest = hmac.new(self._key, payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    async def mint(self, sandbox_id: str) -> str:
        nonce = secrets.token_urlsafe(16)
        return f"{nonce}.{await self._mac(sandbox_id, nonce)}"

    async def check(self, sandbox_id: str, token: str) -> bool:
        m = _TOKEN.match(token)
        return m is not None and hmac.compare_digest(
            m.group(2), await self._mac(sandbox_id, m.group(1))
        )
