"""`envdAccessToken`: a per-sandbox secret, minted at create (and at each connect), kept only
as a hash.

Each token's SHA-256 names an entry in the store's sealed secrets (SQLite and Redis alike), so
a sandbox may hold several (E2B's `connect` hands out a token, and the first one cannot be read
back from its hash) and a check is one lookup by hash, nothing compared byte by byte.
"""

from __future__ import annotations

import hashlib
import secrets

from sandcell.store import Store


def _name(sandbox_id: str, token: str) -> str:
    return f"e2b-envd-token:{sandbox_id}:{hashlib.sha256(token.encode()).hexdigest()}"


async def mint(store: Store, sandbox_id: str) -> str:
    token = secrets.token_urlsafe(32)
    await store.put_secret_if_absent(_name(sandbox_id, token), b"1")
    return token


async def check(store: Store, sandbox_id: str, token: str) -> bool:
    return bool(token) and await store.get_secret(_name(sandbox_id, token)) is not None
