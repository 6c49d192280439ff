"""`envdAccessToken`: a per-sandbox credential, handed out at create and at each connect,
checked on every in-sandbox call, and kept nowhere.

A token is `<sandbox id>.<nonce>.<mac>`, the MAC an HMAC-SHA256 of the sandbox id and the
nonce under a server key kept sealed in the store (so every replica accepts every replica's
tokens). The nonce, too, is derived from the sandbox id under that key, so a sandbox has one
token, as on E2B: `connect` hands out the same one, and a signed file URL (whose signature
is a hash over the token, see `signed`) can be checked by rebuilding it from the id.

A check recomputes the MAC: nothing per token or per sandbox is stored, so nothing of a
deleted sandbox's tokens stays behind, and a token for one sandbox never opens another.
It dies with its sandbox: the sandbox is looked up on every call, and ids are never reused.

The token names its sandbox so that a call without `E2b-Sandbox-Id` (older SDKs after
`Sandbox.connect()`) can be routed by it: `sandbox_of` returns the id only of a genuine
token, whose MAC covers that id. Tokens minted before ids were carried (`<nonce>.<mac>`) are
still accepted with the header, as are those minted with a random nonce before it was derived
(they open calls; only a signed URL needs the derived one).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import re
from collections.abc import Iterable

from sandcell.store import Store

KEY_NAME = "e2b-envd-token-key"
_TOKEN = re.compile(r"\A(?:([A-Za-z0-9_-]{1,64})\.)?([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})\Z")


class AccessTokens:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._key: bytes | None = None
        self._last: dict[str, str] = {}  # the tokens `of_each` gave last, by sandbox id

    async def _digest(self, payload: str) -> bytes:
        if self._key is None:  # one key for every replica, made by whichever asks first
            self._key = await self.store.put_secret_if_absent(KEY_NAME, os.urandom(32))
        return hmac.new(self._key, payload.encode(), hashlib.sha256).digest()

    async def _mac(self, sandbox_id: str, nonce: str) -> str:
        digest = await self._digest(f"e2b-envd:{sandbox_id}:{nonce}")
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    async def mint(self, sandbox_id: str) -> str:
        """The sandbox's token: the same on every call (its 128-bit nonce is a MAC of the id,
        under its own label, so it reveals nothing of the key or of the token's MAC)."""
        seed = await self._digest(f"e2b-envd-nonce:{sandbox_id}")
        nonce = base64.urlsafe_b64encode(seed[:16]).rstrip(b"=").decode()
        return f"{sandbox_id}.{nonce}.{await self._mac(sandbox_id, nonce)}"

    async def of_each(self, sandbox_ids: Iterable[str]) -> dict[str, str]:
        """Each sandbox's token. Those of the previous call are kept (and only those, so the
        memory is that of one call's ids): a search over the live sandboxes makes only the
        new ones' tokens."""
        last, self._last = self._last, {}
        for n, sandbox_id in enumerate(sandbox_ids, 1):
            self._last[sandbox_id] = last.get(sandbox_id) or await self.mint(sandbox_id)
            if n % 256 == 0:  # many new ones leave the event loop to other requests
                await asyncio.sleep(0)
        return self._last

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
