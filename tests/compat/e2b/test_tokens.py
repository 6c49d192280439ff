"""envdAccessToken on both stores: minted, checked, and kept nowhere (only the server key
that MACs them is stored, sealed), so a deleted sandbox leaves no token behind; each names
its sandbox under the MAC."""

from __future__ import annotations

import pytest

from sandcell.compat.e2b.tokens import KEY_NAME, AccessTokens
from sandcell.store import Store

pytestmark = pytest.mark.anyio


async def test_tokens_on_each_store(store: Store) -> None:
    tokens = AccessTokens(store)
    first = await tokens.mint("sbx-a")
    # A connect hands out the same token (rebuilt from the id: signed file URLs need it).
    assert await tokens.mint("sbx-a") == first
    assert await tokens.mint("sbx-b") != first
    assert await tokens.check("sbx-a", first)
    assert not await tokens.check("sbx-b", first)  # another sandbox's token
    assert not await tokens.check("sbx-a", first[:-1])
    assert not await tokens.check("sbx-a", first[:-1] + ("A" if first[-1] != "A" else "B"))
    assert not await tokens.check("sbx-a", "")
    assert not await tokens.check("sbx-a", "x" * 10_000)
    # A token names its sandbox, under its MAC: calls without E2b-Sandbox-Id route by it.
    assert first.startswith("sbx-a.")
    assert await tokens.sandbox_of(first) == "sbx-a"
    nonce_mac = first.removeprefix("sbx-a.")
    assert await tokens.sandbox_of(f"sbx-b.{nonce_mac}") is None  # renamed: the MAC fails
    assert not await tokens.check("sbx-b", f"sbx-b.{nonce_mac}")
    assert await tokens.sandbox_of(nonce_mac) is None  # names none
    assert await tokens.sandbox_of(first[:-1] + ("A" if first[-1] != "A" else "B")) is None
    assert await tokens.sandbox_of("") is None
    assert AccessTokens.names(f"sbx-b.{nonce_mac}") == "sbx-b"  # claimed, not checked
    assert await tokens.check("sbx-a", nonce_mac)  # tokens minted before ids were carried
    # Another replica, with its own cache, checks the same tokens (one sealed key).
    assert await AccessTokens(store).check("sbx-a", first)
    assert await store.get_secret(KEY_NAME) is not None
    assert await store.get_secret(first) is None  # the token itself is stored nowhere


async def test_of_each_keeps_only_the_last_calls_tokens(store: Store) -> None:
    """The signed-URL search rebuilds each live sandbox's token: the same as `mint`, and
    kept only for the ids of the latest call (a deleted sandbox's token is dropped)."""
    tokens = AccessTokens(store)
    first = await tokens.of_each(["sbx-a", "sbx-b"])
    assert first == {"sbx-a": await tokens.mint("sbx-a"), "sbx-b": await tokens.mint("sbx-b")}
    assert set(await tokens.of_each(["sbx-b", "sbx-c"])) == {"sbx-b", "sbx-c"}
    assert set(tokens._last) == {"sbx-b", "sbx-c"}
