"""`envdAccessToken`: a per-sandbox credential, minted at create (and at each connect),
checked on every in-sandbox call, and kept nowhere.

A token is `<sandbox id>.<nonce>.<mac>`, the MAC an HMAC-SHA256 of the sandbox id and the
nonce under a server key kept sealed in the store (so every replica accepts every replica's
tokens). A check recomputes the MAC: nothing per token or per sandbox is stored, so nothing
of a deleted sandbox's tokens stays behind, and a token for one sandbox never opens another.
It dies with its sandbox: the sandbox is looked up on every call, and ids are never reused.

The token names its sandbox so that a call without `E2b-Sandbox-Id` (older SDKs after
`Sandbox.connect()`) can be routed by it: `sandbox_of` returns the id only of a genuine
token, whose MAC covers that id. Tokens minted before ids were carried (`<nonce>.<mac>`) are
still accepted with the header.
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
_TOKEN = re.compile(r"\A(?:([A-Za-z0-9_-]{1,64})\.)?([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})\Z")


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
        return f"{sandbox_id}.{nonce}.{await self._mac(sandbox_id, nonce)}"

    async def check(self, sandbox_id: str, token: str) -> bool:
        """Whether `token` opens `sandbox_id` (a token naming another sandbox never does)."""
        m = _TOKEN.match(token)
        if m is None or m.group(1) not in (None, sandbox_id):
            return False
        return hmac.compare_digest(m.group(3), await self._mac(sandbox_id, m.group(2)))

    @staticmethod
    def names(token: str) -> str | None:
        """The sandbox id `token` claims, unchecked (None: it names none)."""
        m = _TOKEN.match(token)
        return m.group(1) if m else None

    async def sandbox_of(self, token: str) -> str | None:
        """The sandbox a genuine token names; None for a token that names none or is forged."""
        sandbox_id = self.names(token)
        if sandbox_id is None or not await self.check(sandbox_id, token):
            return None
        return sandbox_id
