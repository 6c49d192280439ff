"""Snapshots (SPEC §13) over real cells, on SQLite and on Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from pathlib import Path

import pytest

from sandcell.errors import ServiceError
from sandcell.isolation.cell import LocalCells
from sandcell.manager.manager import Manager
from support.sessions import session_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MIB = 1024 * 1024


async def _run(manager: Manager, sandbox_id: str, command: str) -> str:
    with await session_client(manager, sandbox_id) as client:
        return client.exec(command)["stdout"]


def _snapshot_files(tmp_path: Path) -> list[str]:
    folder = tmp_path / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_snapshot_modify_and_start_from_it(make_manager, tmp_path):
    manager = await make_manager()
    await manager.start()
    parent = await manager.create_sandbox("alice")
    # A writer that runs through the snapshot: frozen while it is taken, thawed after.
    await _run(manager, parent.id, "echo v1 > a.txt; (while :; do date >> log; sleep 0.01; done) &")
    snap = await manager.snapshots.take("alice", parent.id, "first")
    assert snap.id.startswith("snap-") and snap.size_bytes > 0 and snap.owner == "alice"
    assert (await manager.store.get_sandbox(parent.id)).state == "running"
    assert _snapshot_files(tmp_path) == [snap.id]
    await _run(manager, parent.id, "echo v2 > a.txt")
    child = await manager.create_sandbox("alice", snapshot=snap)
    assert await _run(manager, child.id, "cat a.txt; id -u") == "v1\n1000\n"
    assert await _run(manager, parent.id, "cat a.txt") == "v2\n"
    grows = "a=$(wc -l < log); sleep 0.3; b=$(wc -l < log); [ $b -gt $a ] && echo grows"
    assert await _run(manager, parent.id, grows) == "grows\n"  # the writer was thawed
    # A paused sandbox can be snapshotted too (no cell to freeze), and stays paused.
    await manager.persistence.pause(parent.id)
    again = await manager.snapshots.take("alice", parent.id)
    assert (await manager.store.get_sandbox(parent.id)).state == "paused"
    await manager.snapshots.delete(again)
    await manager.snapshots.delete(snap)
    assert _snapshot_files(tmp_path) == [] and await manager.store.list_snapshots() == []
    for record in (parent, child):
        await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_over_quota_is_413_before_any_copy(make_manager, tmp_path, store, cgroup_parent):
    manager = await make_manager()
    manager.snapshots.quota_bytes = 64 * 1024
    await manager.start()
    record = await manager.create_sandbox("alice")
    await _run(manager, record.id, "head -c 1000000 /dev/urandom > big")
    with pytest.raises(ServiceError) as info:
        await manager.snapshots.take("alice", record.id)
    assert info.value.status == 413 and info.value.details["quota_bytes"] == 64 * 1024
    assert _snapshot_files(tmp_path) == []
    assert (await manager.store.get_sandbox(record.id)).state == "running"
    await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_concurrent_snapshots_never_hold_more_than_the_quota(make_manager, tmp_path):
    """Four snapshots at once of four ~20 MiB workspaces under a 64 MiB quota: before the
    bytes were reserved, all four passed the check and 76.5 MiB were held."""
    manager = await make_manager()
    manager.snapshots.quota_bytes = quota = 64 * MIB
    await manager.start()
    records = [await manager.create_sandbox("alice") for _ in range(4)]
    for record in records:
        await _run(manager, record.id, "head -c 20000000 /dev/urandom > big")
    taken = await asyncio.gather(
        *(manager.snapshots.take("alice", r.id) for r in records), return_exceptions=True
    )
    made = [t for t in taken if not isinstance(t, BaseException)]
    refused = [t for t in taken if isinstance(t, BaseException)]
    size = max(s.size_bytes for s in made)
    assert len(made) == quota // size == 3, taken
    assert all(isinstance(e, ServiceError) and e.status == 413 for e in refused), refused
    held = sum(s.size_bytes for s in await manager.store.list_snapshots("alice"))
    assert held <= quota and await manager.store.snapshot_bytes_held("alice") == held
    assert _snapshot_files(tmp_path) == sorted(s.id for s in made)  # no copy of the refused
    for snap in made:
        await manager.snapshots.delete(snap)
    assert await manager.store.snapshot_bytes_held("alice") == 0
    for record in records:
        await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_a_workspace_grown_while_measured_is_settled_against_the_quota(
    make_manager, tmp_path
):
    """The tenant writes between the measurement (what is reserved) and the frozen copy:
    the copy's real size is what counts, and past the quota it is dropped with the 413."""
    manager = await make_manager()
    manager.snapshots.quota_bytes = 16 * MIB
    await manager.start()
    record = await manager.create_sandbox("alice")
    await _run(manager, record.id, "head -c 1000000 /dev/urandom > small")
    measure = manager.backend.workspace_bytes

    async def measured_then_grown(cell, home):
        size = await measure(cell, home)
        await _run(manager, record.id, "head -c 20000000 /dev/urandom > grown")
        return size

    manager.backend.workspace_bytes = measured_then_grown
    with pytest.raises(ServiceError) as info:
        await manager.snapshots.take("alice", record.id)
    assert info.value.status == 413 and info.value.details["size_bytes"] > 20_000_000
    assert _snapshot_files(tmp_path) == [] and await manager.store.list_snapshots() == []
    assert await manager.store.snapshot_bytes_held("alice") == 0  # given back
    assert (await manager.store.get_sandbox(record.id)).state == "running"
    assert await _run(manager, record.id, "echo alive") == "alive\n"  # thawed
    await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_disk_full_during_a_snapshot_fails_cleanly(make_manager, tmp_path):
    folder = tmp_path / "snapshots"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True)
    try:
        manager = await make_manager()
        await manager.start()
        record = await manager.create_sandbox("alice")
        await _run(manager, record.id, "head -c 4000000 /dev/urandom > big")
        with pytest.raises(ServiceError) as info:
            await manager.snapshots.take("alice", record.id)
        assert info.value.status == 503
        assert _snapshot_files(tmp_path) == [] and await manager.store.list_snapshots() == []
        assert await manager.store.snapshot_bytes_held("alice") == 0  # given back
        assert await _run(manager, record.id, "echo alive") == "alive\n"  # thawed
        await manager.delete_sandbox(record.id)
        await manager.stop()
    finally:
        subprocess.run(["umount", str(folder)], check=True)


async def test_restart_mid_snapshot_thaws_and_lists_no_half_snapshot(
    make_manager, tmp_path, cgroup_parent
):
    manager = await make_manager()
    await manager.start()
    record = await manager.create_sandbox("alice")
    await _run(manager, record.id, "echo kept > a.txt")
    # Died mid-copy: the sandbox held and frozen, a partial copy on disk, no record.
    held = await manager.persistence.hold(record.id)
    cells = LocalCells(tmp_path / "cells", cgroup_parent=cgroup_parent)
    cg = cells.cgroups.open(cells._read_info(tmp_path / "cells" / record.cell["cell_id"]).cgroup)
    cg._freeze(True, 2.0)
    (tmp_path / "snapshots").mkdir()
    (tmp_path / "snapshots" / "snap-0000000000000000.partial").write_bytes(b"half")
    (tmp_path / "snapshots" / "snap-1111111111111111").write_bytes(b"whole, unrecorded")
    await manager.stop()
    assert dataclasses.replace(held).state == "snapshotting"

    restarted = await make_manager()
    await restarted.start()
    assert (await restarted.store.get_sandbox(record.id)).state == "running"
    assert await _run(restarted, record.id, "cat a.txt") == "kept\n"
    assert _snapshot_files(tmp_path) == [] and await restarted.store.list_snapshots() == []
    await restarted.delete_sandbox(record.id)
    await restarted.stop()


async def test_start_from_another_template_is_400(make_manager):
    manager = await make_manager(default={}, other={})
    await manager.start()
    record = await manager.create_sandbox("alice")
    snap = await manager.snapshots.take("alice", record.id)
    with pytest.raises(ServiceError) as info:
        await manager.create_sandbox("alice", "other", snapshot=snap)
    assert info.value.status == 400
    await manager.snapshots.delete(snap)
    await manager.delete_sandbox(record.id)
    await manager.stop()
