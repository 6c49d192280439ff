"""The session cookie's value, over each real store: any replica sharing the store opens
another's, and nothing else opens (SPEC §19)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from sandcell.console import session
from sandcell.store import Sealer, Store, hash_api_key, open_store

pytestmark = pytest.mark.anyio


async def test_another_replica_opens_it(store: Store, store_url: str, sealer: Sealer) -> None:
    value, issued = await session.issue(store, hash_api_key("sc_key"))
    async with open_store(store_url, sealer) as replica:
        assert await session.read(replica, value) == issued
    assert issued.key_hash == hash_api_key("sc_key")
    assert "sc_key" not in value


async def test_nothing_else_opens(store: Store, store_url: str) -> None:
    value, _ = await session.issue(store, hash_api_key("sc_key"))
    flipped = value[:30] + ("A" if value[30] != "A" else "B") + value[31:]
    for bad in (flipped, value[:-4], "", "%%%", "AQ"):
        assert await session.read(store, bad) is None
    # Under another store key (a store of its own, or this one's secrets unreadable), no.
    async with open_store(store_url.replace("store.db", "other.db"), Sealer(b"\x01" * 32)) as other:
        assert await session.read(other, value) is None


async def test_it_expires(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    value, issued = await session.issue(store, hash_api_key("sc_key"))
    later = issued.expires_at + 1
    monkeypatch.setattr(session, "time", SimpleNamespace(time=lambda: later))
    assert await session.read(store, value) is None
    monkeypatch.setattr(session, "time", SimpleNamespace(time=time.time))
    assert await session.read(store, value) == issued
