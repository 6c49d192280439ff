"""envdAccessToken on both stores: minted, checked, kept only as a hash."""

from __future__ import annotations

import hashlib

import pytest

from sandcell.compat.e2b import tokens
from sandcell.store import Store

pytestmark = pytest.mark.anyio


async def test_tokens_on_each_store(store: Store) -> None:
    first = await tokens.mint(store, "sbx-a")
    second = await tokens.mint(store, "sbx-a")  # a connect hands out another
    assert first != second
    assert await tokens.check(store, "sbx-a", first)
    assert await tokens.check(store, "sbx-a", second)
    assert not await tokens.check(store, "sbx-b", first)  # another sandbox's token
    assert not await tokens.check(store, "sbx-a", first[:-1])
    assert not await tokens.check(store, "sbx-a", "")
    digest = hashlib.sha256(first.encode()).hexdigest()
    assert await store.get_secret(f"e2b-envd-token:sbx-a:{digest}") is not None
    assert await store.get_secret(first) is None  # the token itself is stored nowhere
