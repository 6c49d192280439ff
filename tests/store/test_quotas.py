"""Per-owner bounds kept by the store (SPEC §13): snapshot bytes and paused workspaces, each
counted and held in one atomic step, so replicas racing for the last room cannot all get it.
Run against both backends (SQLite file and a real Redis server)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from sandcell.store import SandboxRecord, Sealer, SnapshotRecord, Store
from sandcell.store import base as store_base

from .helpers import make_sandbox, race

pytestmark = pytest.mark.anyio
MIB = 1024 * 1024


def _snapshot(snapshot_id: str, size: int, owner: str = "alice") -> SnapshotRecord:
    return SnapshotRecord(snapshot_id, owner, "sbx-1", "", "default", time.time(), size, "/x")


def _running(sandbox_id: str, owner: str = "alice") -> SandboxRecord:
    now = time.time()
    return make_sandbox(sandbox_id, owner=owner, expires_at=now + 3600, last_activity_at=now)


def _pausing(record: SandboxRecord) -> SandboxRecord:
    return dataclasses.replace(record, state="pausing", workspace=f"/w/{record.id}")


def _paused(record: SandboxRecord) -> SandboxRecord:
    now = time.time()
    return dataclasses.replace(
        record, state="paused", paused_at=now, expires_at=now + 60, last_activity_at=now + 60
    )


# -- snapshot bytes --------------------------------------------------------------------------


def test_replicas_racing_for_snapshot_bytes_never_hold_more_than_the_quota(
    store_url: str, sealer: Sealer
) -> None:
    """Eight replicas each ask for 20 MiB of a 64 MiB quota at once: three get them."""
    results = race(
        store_url,
        sealer,
        8,
        lambda store, _: store.reserve_snapshot_bytes("alice", 20 * MIB, 64 * MIB),
    )
    assert sum(r is not None for r in results) == 3, results


async def test_snapshot_bytes_lifecycle(store: Store) -> None:
    quota = 100
    await store.put_snapshot(_snapshot("snap-old", 30))
    first = await store.reserve_snapshot_bytes("alice", 40, quota)
    assert first is not None and await store.snapshot_bytes_held("alice") == 70
    assert await store.reserve_snapshot_bytes("alice", 31, quota) is None  # 30 + 40 + 31
    assert await store.reserve_snapshot_bytes("bob", 100, quota) is not None  # per owner

    # Settled to the copy's real size: smaller always fits, larger only within the quota.
    assert await store.resize_snapshot_reservation(first, 71, quota) is None
    assert await store.snapshot_bytes_held("alice") == 70  # the old size still held
    grown = await store.resize_snapshot_reservation(first, 70, quota)
    assert grown is not None and await store.snapshot_bytes_held("alice") == 100
    settled = await store.resize_snapshot_reservation(grown, 25, quota)
    assert settled is not None and await store.snapshot_bytes_held("alice") == 55

    # The record takes its reservation's place: counted once, neither twice nor zero times.
    await store.put_snapshot(_snapshot("snap-new", 25), settled)
    await store.release_snapshot_bytes(settled)  # consumed already: no effect
    assert await store.snapshot_bytes_held("alice") == 55
    assert await store.reserve_snapshot_bytes("alice", 46, quota) is None
    assert await store.delete_snapshot("snap-new")
    assert await store.snapshot_bytes_held("alice") == 30

    failed = await store.reserve_snapshot_bytes("alice", 70, quota)
    assert failed is not None
    await store.release_snapshot_bytes(failed)  # that copy failed: its bytes are free again
    assert await store.snapshot_bytes_held("alice") == 30


async def test_lost_snapshot_bytes_end_with_their_lease(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that died mid-copy never gives its bytes back: the lease does."""
    monkeypatch.setattr(store_base, "SNAPSHOT_LEASE_S", 0.0)
    assert await store.reserve_snapshot_bytes("alice", 60, 100) is not None
    assert await store.reserve_snapshot_bytes("alice", 60, 100) is not None
    assert await store.snapshot_bytes_held("alice") == 0


async def test_repair_makes_the_quota_count_the_listed_snapshots(store: Store) -> None:
    """A crash between a snapshot's record and its quota entry (Redis keeps them apart)
    leaves a listed snapshot uncounted, or a deleted one counted: a restart repairs both."""
    await store.put_snapshot(_snapshot("snap-kept", 40))
    await store.put_snapshot(_snapshot("snap-gone", 50))
    held = await store.reserve_snapshot_bytes("alice", 5, 1000)
    if hasattr(store, "_r"):  # what the crashes leave behind, in Redis's own terms
        key = "sandcell:snapquota:{alice}"
        await store._r.hdel(key, "snap-kept")
        await store._r.delete("sandcell:snap:{snap-gone}")
        await store._r.zrem("sandcell:{idx}:snaps", "snap-gone")
    else:
        await store.delete_snapshot("snap-gone")
    await store.repair_snapshot_quota()
    assert await store.snapshot_bytes_held("alice") == 45  # snap-kept and the reservation
    assert held is not None


# -- paused workspaces -----------------------------------------------------------------------


async def test_start_pause_counts_the_owners_kept_workspaces(store: Store) -> None:
    records = [_running(f"sbx-{i}") for i in range(4)]
    for record in [*records, _running("sbx-bob", owner="bob")]:
        await store.put_sandbox(record)
    assert await store.start_pause(_pausing(records[0]), 2) == "moved"
    assert await store.start_pause(_pausing(records[0]), 2) == "lost"  # not running any more
    assert await store.transition(_paused(records[0]), ("pausing",))
    assert await store.start_pause(_pausing(records[1]), 2) == "moved"
    assert await store.start_pause(_pausing(records[2]), 2) == "full"  # one paused, one pausing
    assert (await store.get_sandbox(records[2].id)).state == "running"  # refused: untouched
    assert await store.start_pause(_pausing(_running("sbx-bob", owner="bob")), 2) == "moved"

    # A paused one being snapshotted or resumed still keeps its workspace; once running, not.
    snapshotting = dataclasses.replace(_paused(records[0]), state="snapshotting")
    assert await store.transition(snapshotting, ("paused",))
    assert await store.start_pause(_pausing(records[2]), 2) == "full"
    resuming = dataclasses.replace(snapshotting, state="resuming")
    assert await store.transition(resuming, ("snapshotting",))
    assert await store.start_pause(_pausing(records[2]), 2) == "full"
    running = dataclasses.replace(resuming, state="running", paused_at=0.0)
    assert await store.transition(running, ("resuming",))
    assert await store.start_pause(_pausing(records[2]), 2) == "moved"
    assert await store.start_pause(_pausing(records[3]), 2) == "full"
    assert await store.delete_sandbox(records[1].id)  # a deleted one frees its place
    assert await store.start_pause(_pausing(records[3]), 2) == "moved"


def test_replicas_racing_to_pause_never_keep_more_than_the_limit(
    store_url: str, sealer: Sealer
) -> None:
    """Eight replicas each pause another of one owner's sandboxes at once, limit 3."""
    records = [_running(f"sbx-{i}") for i in range(8)]

    async def put_all(store: Store, i: int) -> None:
        if i == 0:
            for record in records:
                await store.put_sandbox(record)

    race(store_url, sealer, 1, put_all)
    results = race(
        store_url, sealer, 8, lambda store, i: store.start_pause(_pausing(records[i]), 3)
    )
    assert sorted(results) == ["full"] * 5 + ["moved"] * 3, results
