"""The store contract, run against both backends (SQLite file and a real Redis server)."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from sandcell.store import (
    ApiKeyExistsError,
    ApiKeyRecord,
    SandboxRecord,
    Sealer,
    Store,
    StoreCryptoError,
    hash_api_key,
    new_api_key,
    open_store,
)
from sandcell.store import base as store_base

from .helpers import T0, Raw, make_sandbox, new_pem
from .helpers import race as _race

pytestmark = pytest.mark.anyio


def _api_key(name: str, principal: str = "alice", admin: bool = False) -> ApiKeyRecord:
    return ApiKeyRecord(name, principal, hash_api_key(new_api_key()), admin, T0)


async def test_crud_and_listing_by_owner(store: Store) -> None:
    a1 = make_sandbox("a1", created_at=T0 + 2)
    a2 = make_sandbox("a2", created_at=T0 + 1)
    b1 = make_sandbox("b1", owner="bob", created_at=T0 + 3)
    for rec in (a1, a2, b1):
        await store.put_sandbox(rec)

    assert await store.get_sandbox("a1") == a1
    assert await store.get_sandbox("nope") is None
    assert await store.list_sandboxes() == [a2, a1, b1]  # oldest first
    assert await store.list_sandboxes("alice") == [a2, a1]
    assert await store.list_sandboxes("bob") == [b1]
    assert await store.list_sandboxes("carol") == []
    assert [await store.count_sandboxes(o) for o in ("alice", "bob", "carol", None)] == [2, 1, 0, 3]

    assert await store.update_state("a1", "deleting")
    assert (await store.get_sandbox("a1")).state == "deleting"
    assert not await store.update_state("nope", "failed")
    assert await store.get_sandbox("nope") is None  # not created by the update
    with pytest.raises(ValueError, match="invalid sandbox state"):
        await store.update_state("a1", "zombie")  # type: ignore[arg-type]


async def test_put_replaces_record_but_keeps_session_key(store: Store) -> None:
    await store.put_sandbox(make_sandbox("s", state="creating"))
    pem = new_pem()
    assert await store.put_session_key("s", pem)
    updated = make_sandbox("s", endpoint={"host": "10.0.0.7", "port": 8080})
    await store.put_sandbox(updated)
    assert await store.get_sandbox("s") == updated
    assert await store.get_session_key("s") == pem


async def test_touch_moves_deadline_and_reaper_sees_expiries(store: Store) -> None:
    await store.put_sandbox(make_sandbox("idle"))  # deadline T0 + 300 (idle)
    await store.put_sandbox(make_sandbox("old", expires_at=T0 + 100))  # deadline T0 + 100 (max age)
    await store.put_sandbox(make_sandbox("live", idle_timeout_s=10_000))  # deadline T0 + 3600

    assert await store.due_for_reaping(T0 + 99, 10) == []
    await store.touch("old", T0 + 90)  # activity does not extend the max lifetime
    assert await store.due_for_reaping(T0 + 100, 10) == ["old"]
    assert sorted(await store.due_for_reaping(T0 + 300, 10)) == ["idle", "old"]

    assert await store.touch("idle", T0 + 250)  # idle deadline moves to T0 + 550
    assert await store.due_for_reaping(T0 + 549, 10) == ["old"]
    assert sorted(await store.due_for_reaping(T0 + 550, 10)) == ["idle", "old"]
    assert (await store.get_sandbox("idle")).last_activity_at == T0 + 250

    # A shorter idle timeout pulls the deadline earlier: T0 + 260 + 5.
    assert await store.touch("live", T0 + 260, idle_timeout_s=5)
    assert (await store.get_sandbox("live")).deadline == T0 + 265
    assert sorted(await store.due_for_reaping(T0 + 265, 10)) == ["live", "old"]
    assert await store.due_for_reaping(T0 + 264, 10) == ["old"]

    assert not await store.touch("nope", T0)
    assert await store.get_sandbox("nope") is None
    assert len(await store.due_for_reaping(T0 + 10_000, 2)) == 2
    assert await store.due_for_reaping(T0 + 10_000, 0) == []


async def test_delete_removes_record_key_and_index_entries(store: Store) -> None:
    await store.put_sandbox(make_sandbox("gone"))
    await store.put_sandbox(make_sandbox("kept"))
    assert await store.put_session_key("gone", new_pem())

    assert await store.delete_sandbox("gone")
    assert await store.get_sandbox("gone") is None
    assert await store.get_session_key("gone") is None
    assert [r.id for r in await store.list_sandboxes("alice")] == ["kept"]
    assert await store.count_sandboxes() == 1
    assert await store.due_for_reaping(T0 + 10_000, 10) == ["kept"]
    assert not await store.delete_sandbox("gone")

    # Late writers (a keepalive, a slow init) must not resurrect it.
    assert not await store.put_session_key("gone", new_pem())
    assert not await store.touch("gone", T0 + 1)
    assert await store.get_sandbox("gone") is None
    assert await store.get_session_key("gone") is None


async def test_session_key_round_trip(store: Store) -> None:
    await store.put_sandbox(make_sandbox("s"))
    assert await store.get_session_key("s") is None
    assert await store.get_session_key("nope") is None
    pem = new_pem()
    assert await store.put_session_key("s", pem)
    assert await store.get_session_key("s") == pem


async def test_session_key_is_sealed_at_rest(store: Store, raw: Raw) -> None:
    await store.put_sandbox(make_sandbox("s"))
    pem = new_pem()
    await store.put_session_key("s", pem)
    body_lines = pem.splitlines()[1:-1]
    der = base64.b64decode(b"".join(body_lines))

    stored = raw.dump()
    assert raw.session_blob("s") is not None
    assert pem not in stored
    assert b"PRIVATE KEY" not in stored
    assert b"".join(body_lines) not in stored
    assert all(line not in stored for line in body_lines)
    assert der[-32:] not in stored  # nor the raw key bytes


async def test_ciphertext_moved_to_another_record_fails(store: Store, raw: Raw) -> None:
    await store.put_sandbox(make_sandbox("victim"))
    await store.put_sandbox(make_sandbox("attacker", owner="mallory"))
    pem = new_pem()
    await store.put_session_key("victim", pem)

    raw.set_session_blob("attacker", raw.session_blob("victim"))
    with pytest.raises(StoreCryptoError):
        await store.get_session_key("attacker")
    assert await store.get_session_key("victim") == pem

    blob = bytearray(raw.session_blob("victim"))
    blob[-1] ^= 1
    raw.set_session_blob("victim", bytes(blob))
    with pytest.raises(StoreCryptoError):
        await store.get_session_key("victim")


async def test_wrong_store_key_fails(store: Store, store_url: str) -> None:
    await store.put_sandbox(make_sandbox("s"))
    await store.put_session_key("s", new_pem())
    await store.put_secret_if_absent("bootstrap", b"secret")
    async with open_store(store_url, Sealer(b"\x07" * 32)) as other:
        assert (await other.get_sandbox("s")).id == "s"  # records are readable...
        with pytest.raises(StoreCryptoError, match="wrong store key"):
            await other.get_session_key("s")  # ...sealed values are not
        with pytest.raises(StoreCryptoError):
            await other.get_secret("bootstrap")


async def test_api_keys(store: Store) -> None:
    alice, admin = _api_key("alice-laptop"), _api_key("ops", principal="ops", admin=True)
    await store.put_api_key(alice)
    await store.put_api_key(admin)
    assert await store.get_api_key_by_hash(alice.key_hash) == alice
    assert await store.get_api_key_by_hash(admin.key_hash) == admin
    assert await store.get_api_key_by_hash(hash_api_key("sc_guess")) is None
    assert await store.list_api_keys() == [alice, admin]

    clash = _api_key("alice-laptop", principal="mallory")
    with pytest.raises(ApiKeyExistsError):
        await store.put_api_key(clash)
    assert await store.get_api_key_by_hash(clash.key_hash) is None
    assert await store.get_api_key_by_hash(alice.key_hash) == alice

    assert await store.revoke_api_key("alice-laptop")
    assert not await store.revoke_api_key("nope")
    assert (await store.get_api_key_by_hash(alice.key_hash)).revoked
    assert [(k.name, k.revoked) for k in await store.list_api_keys()] == [
        ("alice-laptop", True),
        ("ops", False),
    ]


async def test_secrets_are_sealed_and_first_writer_wins(store: Store, raw: Raw) -> None:
    assert await store.get_secret("bootstrap") is None
    assert await store.put_secret_if_absent("bootstrap", b"first-secret-value") == (
        b"first-secret-value"
    )
    assert await store.put_secret_if_absent("bootstrap", b"second") == b"first-secret-value"
    assert await store.get_secret("bootstrap") == b"first-secret-value"
    assert b"first-secret-value" not in raw.dump()


def test_put_secret_if_absent_race_between_replicas(store_url: str, sealer: Sealer) -> None:
    """20 replicas start at once; one value wins."""
    results = _race(
        store_url,
        sealer,
        20,
        lambda store, i: store.put_secret_if_absent("bootstrap", f"key-{i}".encode()),
    )
    assert len(set(results)) == 1, results
    assert results[0].startswith(b"key-")


def test_reservations_hold_the_limit_under_a_race(store_url: str, sealer: Sealer) -> None:
    """Nine creates of one owner reserve at once, from nine connections: three slots, three
    winners, whatever the interleaving; another owner is not affected."""
    results = _race(store_url, sealer, 9, lambda store, _: store.reserve_sandbox("alice", 3))
    assert sum(r is not None for r in results) == 3, results
    results = _race(store_url, sealer, 2, lambda store, _: store.reserve_sandbox("bob", 3))
    assert all(r is not None for r in results)


def _future_sandbox(sandbox_id: str) -> SandboxRecord:
    return make_sandbox(sandbox_id, expires_at=time.time() + 3600)


async def test_reservation_lifecycle(store: Store) -> None:
    await store.put_sandbox(_future_sandbox("live"))
    await store.put_sandbox(make_sandbox("overdue"))  # past its lifetime: the reaper's now
    first = await store.reserve_sandbox("alice", 3)
    second = await store.reserve_sandbox("alice", 3)
    assert first is not None and second is not None
    assert await store.reserve_sandbox("alice", 3) is None  # 1 sandbox + 2 creates in flight

    await store.release_reservation(second)  # that create failed: its slot is free again
    third = await store.reserve_sandbox("alice", 3)
    assert third is not None
    await store.release_reservation(second)  # twice is harmless

    # A record takes its reservation's place: counted once, neither twice nor zero times.
    await store.put_sandbox(_future_sandbox("new"), first)
    await store.release_reservation(first)  # consumed already: no effect
    assert await store.reserve_sandbox("alice", 3) is None
    assert await store.delete_sandbox("new")
    assert await store.reserve_sandbox("alice", 3) is not None


async def test_a_lost_reservation_ends_with_its_lease(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that died mid-create never gives its slot back: the lease does."""
    monkeypatch.setattr(store_base, "RESERVATION_LEASE_S", 0.0)
    assert await store.reserve_sandbox("alice", 1) is not None
    assert await store.reserve_sandbox("alice", 1) is not None


async def test_concurrent_tasks_share_one_store(store: Store) -> None:
    await store.put_sandbox(make_sandbox("s"))
    values = await asyncio.gather(
        *(store.put_secret_if_absent("bootstrap", bytes([i])) for i in range(20)),
        *(store.touch("s", T0 + i) for i in range(20)),
    )
    assert len(set(values[:20])) == 1
    assert all(values[20:])
    await store.ping()
