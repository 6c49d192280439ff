"""Principals' secrets in both stores (SPEC §17): sealed at rest, bound to owner and name."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import redis

from sandcell.store import Store, StoreCryptoError, UserSecretRecord

pytestmark = pytest.mark.anyio
VALUE = b"sk-live-0123456789abcdef-the-real-value"


def _rec(owner: str = "alice", name: str = "OPENAI_API_KEY", **kw: object) -> UserSecretRecord:
    values: dict = {"hosts": ("api.openai.com",), "places": ("headers",)}
    values |= {"created_at": 1.0, "updated_at": 1.0} | kw
    return UserSecretRecord(owner=owner, name=name, **values)


def _raw_blob(store_url: str, owner: str, name: str) -> bytes | None:
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(Path(store_url.removeprefix("sqlite://"))) as conn:
            row = conn.execute(
                "SELECT value FROM user_secrets WHERE owner = ? AND name = ?", (owner, name)
            ).fetchone()
        conn.close()
        return row[0] if row else None
    with redis.Redis.from_url(store_url) as client:
        return client.hget(f"sandcell:usecret:{{{owner}}}:{name}", "value")


def _set_raw_blob(store_url: str, owner: str, name: str, blob: bytes) -> None:
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(Path(store_url.removeprefix("sqlite://"))) as conn:
            conn.execute(
                "UPDATE user_secrets SET value = ? WHERE owner = ? AND name = ?",
                (blob, owner, name),
            )
        conn.close()
        return
    with redis.Redis.from_url(store_url) as client:
        client.hset(f"sandcell:usecret:{{{owner}}}:{name}", "value", blob)


def _dump(store_url: str) -> bytes:
    if store_url.startswith("sqlite:"):
        path = Path(store_url.removeprefix("sqlite://"))
        files = [path, path.with_name(path.name + "-wal")]
        return b"".join(f.read_bytes() for f in files if f.exists())
    with redis.Redis.from_url(store_url) as client:
        chunks: list[bytes] = []
        for key in client.scan_iter():
            kind = client.type(key)
            if kind == b"hash":
                for field, value in client.hgetall(key).items():
                    chunks += [field, value]
            elif kind == b"set":
                chunks += list(client.smembers(key))
            elif kind == b"string":
                chunks.append(client.get(key))
        return b"\0".join(chunks)


async def test_round_trip_and_listing(store: Store) -> None:
    assert await store.put_user_secret(_rec(), VALUE, limit=10) == "created"
    assert await store.put_user_secret(_rec(name="GH_TOKEN"), b"ghp", limit=10) == "created"
    assert await store.user_secret_value("alice", "OPENAI_API_KEY") == VALUE
    got = await store.get_user_secret("alice", "OPENAI_API_KEY")
    assert got == _rec()
    assert [r.name for r in await store.list_user_secrets("alice")] == [
        "GH_TOKEN",
        "OPENAI_API_KEY",
    ]
    assert await store.list_user_secrets("bob") == []
    assert await store.get_user_secret("bob", "OPENAI_API_KEY") is None
    assert await store.user_secret_value("bob", "OPENAI_API_KEY") is None


async def test_name_taken_and_limit(store: Store) -> None:
    assert await store.put_user_secret(_rec(), VALUE, limit=1) == "created"
    assert await store.put_user_secret(_rec(), b"other", limit=5) == "exists"
    assert await store.user_secret_value("alice", "OPENAI_API_KEY") == VALUE  # not overwritten
    assert await store.put_user_secret(_rec(name="B"), b"x", limit=1) == "full"
    assert await store.put_user_secret(_rec(owner="bob"), b"x", limit=1) == "created"


async def test_rotation_and_delete(store: Store) -> None:
    await store.put_user_secret(_rec(), VALUE, limit=10)
    moved = _rec(hosts=("api.example.com:8443",), updated_at=2.0)
    assert await store.update_user_secret(moved, None)  # hosts only: the value stays
    assert await store.user_secret_value("alice", "OPENAI_API_KEY") == VALUE
    assert await store.update_user_secret(moved, b"rotated")
    assert await store.user_secret_value("alice", "OPENAI_API_KEY") == b"rotated"
    got = await store.get_user_secret("alice", "OPENAI_API_KEY")
    assert got is not None and got.hosts == ("api.example.com:8443",) and got.created_at == 1.0
    assert await store.delete_user_secret("alice", "OPENAI_API_KEY")
    assert not await store.delete_user_secret("alice", "OPENAI_API_KEY")
    assert not await store.update_user_secret(moved, b"late")  # never recreated
    assert await store.get_user_secret("alice", "OPENAI_API_KEY") is None
    assert await store.list_user_secrets("alice") == []
    assert await store.put_user_secret(_rec(), VALUE, limit=1) == "created"  # slot given back


async def test_sealed_at_rest(store: Store, store_url: str) -> None:
    await store.put_user_secret(_rec(), VALUE, limit=10)
    await store.update_user_secret(_rec(updated_at=2.0), VALUE + b"-2")
    blob = _raw_blob(store_url, "alice", "OPENAI_API_KEY")
    assert blob is not None and VALUE not in blob
    assert VALUE not in _dump(store_url)


async def test_ciphertext_moved_does_not_open(store: Store, store_url: str) -> None:
    await store.put_user_secret(_rec(), VALUE, limit=10)
    await store.put_user_secret(_rec(name="OTHER"), b"other", limit=10)
    await store.put_user_secret(_rec(owner="mallory"), b"mine", limit=10)
    blob = _raw_blob(store_url, "alice", "OPENAI_API_KEY")
    assert blob is not None
    _set_raw_blob(store_url, "alice", "OTHER", blob)  # another record of the same owner
    _set_raw_blob(store_url, "mallory", "OPENAI_API_KEY", blob)  # another principal
    for owner, name in (("alice", "OTHER"), ("mallory", "OPENAI_API_KEY")):
        with pytest.raises(StoreCryptoError) as caught:
            await store.user_secret_value(owner, name)
        assert VALUE.decode() not in str(caught.value)
    assert await store.user_secret_value("alice", "OPENAI_API_KEY") == VALUE


async def test_repr_of_record_has_no_value() -> None:
    assert "sk-live" not in repr(_rec())  # the record holds no value at all
