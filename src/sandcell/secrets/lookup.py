"""`bindings_from_store`: the egress proxy's view of a sandbox's secrets, read from the store
on each lookup, so it survives a router restart, a rotation reaches the next connection, and
a deleted secret drops out (the proxy then refuses its placeholder)."""

from __future__ import annotations

from typing import cast

from sandcell.secrets.bindings import BindingsLookup, SecretBinding, Where
from sandcell.secrets.shapes import host_name
from sandcell.store import Store


def bindings_from_store(store: Store) -> BindingsLookup:
    """The lookup over `store`, which opens each value itself (bound to owner and name)."""

    async def lookup(sandbox_id: str) -> tuple[SecretBinding, ...]:
        record = await store.get_sandbox(sandbox_id)
        if record is None or not record.secrets:
            return ()
        found: list[SecretBinding] = []
        for name, placeholder in sorted(record.secrets.items()):
            secret = await store.get_user_secret(record.owner, name)
            value = await store.user_secret_value(record.owner, name)
            if secret is None or value is None:  # deleted since the sandbox was made
                continue
            found.append(
                SecretBinding(
                    name=name,
                    placeholder=placeholder,
                    value=value,
                    hosts=frozenset(host_name(h) for h in secret.hosts),
                    where=frozenset(cast(tuple[Where, ...], secret.places)),
                )
            )
        return tuple(found)

    return lookup
