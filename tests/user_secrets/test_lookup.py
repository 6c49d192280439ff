"""`bindings_from_store` over both stores: what the egress proxy is told of a sandbox's
secrets is read fresh from the store each time (rotation, deletion), and only ever the
sandbox owner's own secrets."""

from __future__ import annotations

import pytest

from sandcell.secrets.grants import new_placeholder
from sandcell.secrets.lookup import bindings_from_store
from sandcell.store import Store, UserSecretRecord
from store.helpers import make_sandbox

pytestmark = pytest.mark.anyio


def _secret(owner: str, name: str, *hosts: str, places: tuple[str, ...] = ("headers",)):
    return UserSecretRecord(owner, name, hosts, places, 1.0, 1.0)


async def test_current_values_of_the_owners_secrets(store: Store) -> None:
    lookup = bindings_from_store(store)
    a, b = new_placeholder("API"), new_placeholder("OTHER")
    await store.put_sandbox(make_sandbox("sbx-1", secrets={"API": a, "OTHER": b}))
    await store.put_user_secret(_secret("alice", "API", "api.example.com:8443"), b"v1", 10)
    await store.put_user_secret(_secret("mallory", "OTHER", "evil.example"), b"hers", 10)
    (binding,) = await lookup("sbx-1")  # OTHER is mallory's, not the owner's: not bound
    assert (binding.name, binding.placeholder, binding.value) == ("API", a, b"v1")
    assert binding.hosts == {"api.example.com"} and binding.where == {"headers"}

    rotated = _secret("alice", "API", "api.example.com", places=("headers", "body"))
    await store.update_user_secret(rotated, b"v2")
    (binding,) = await lookup("sbx-1")
    assert binding.value == b"v2" and binding.where == {"headers", "body"}
    await store.delete_user_secret("alice", "API")
    assert await lookup("sbx-1") == ()
    assert await lookup("sbx-gone") == ()


async def test_a_sandbox_without_secrets_has_none(store: Store) -> None:
    await store.put_sandbox(make_sandbox("sbx-2"))
    await store.put_user_secret(_secret("alice", "API", "api.example.com"), b"v", 10)
    assert await bindings_from_store(store)("sbx-2") == ()
    assert (await store.get_sandbox("sbx-2")).secrets == {}
