"""Pause and resume (SPEC §13) over real cells, on SQLite and on Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import pytest

from sandcell.errors import ServiceError
from sandcell.isolation.cell import LocalCells
from sandcell.manager.manager import Manager
from support.sessions import session_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _cell_dirs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cells").iterdir())


async def _started(make_manager, **templates) -> Manager:
    manager = await make_manager(**templates)
    await manager.start()
    return manager


async def test_pause_keeps_files_ends_processes_and_resume_restores(make_manager, tmp_path):
    manager = await _started(make_manager)
    record = await manager.create_sandbox("alice", env={"GREETING": "hi"}, metadata={"k": "v"})
    with await session_client(manager, record.id) as client:
        client.exec("echo kept > note.txt && mkdir -p d && ln -s ../note.txt d/link")
        client.exec("sleep 1000 >/dev/null 2>&1 & echo started")
    old_key = await manager.store.get_session_key(record.id)

    paused = await manager.persistence.pause(record.id)
    assert paused.state == "paused" and paused.endpoint == {}
    assert _cell_dirs(tmp_path) == []  # the cell and every process of it are gone
    assert Path(paused.workspace).exists()
    assert await manager.store.reserve_sandbox("alice", 1) is not None  # counts against no limit
    again = await manager.persistence.pause(record.id)  # idempotent
    assert again.state == "paused"

    running = await manager.persistence.resume(record.id)
    assert running.id == record.id and running.state == "running"
    assert running.metadata == {"k": "v"} and running.cell != record.cell
    assert await manager.store.get_session_key(record.id) != old_key  # a new two-stage init
    with await session_client(manager, record.id) as client:
        out = client.exec("cat note.txt d/link; echo $GREETING; pgrep -c sleep || true")
        assert out["stdout"] == "kept\nkept\nhi\n0\n"
        assert client.exec("echo more >> note.txt && id -u")["stdout"] == "1000\n"
    assert not Path(running.workspace).exists()  # in the cell now, not in two places
    assert await manager.delete_sandbox(record.id) is True
    assert _cell_dirs(tmp_path) == [] and not Path(running.workspace).exists()
    await manager.stop()


async def test_resume_of_unknown_is_404_and_of_deleted_paused_is_404(make_manager):
    manager = await _started(make_manager)
    record = await manager.create_sandbox("alice")
    await manager.persistence.pause(record.id)
    assert await manager.delete_sandbox(record.id) is True
    assert not Path(manager.backend.workspace_home(record.id)).exists()
    for call in (manager.persistence.resume, manager.persistence.pause):
        with pytest.raises(ServiceError) as info:
            await call(record.id)
        assert info.value.status == 404
    await manager.stop()


async def test_concurrent_resumes_start_one_cell(make_manager, tmp_path):
    manager = await _started(make_manager)
    record = await manager.create_sandbox("alice")
    await manager.persistence.pause(record.id)
    results = await asyncio.gather(*(manager.persistence.resume(record.id) for _ in range(3)))
    assert {r.state for r in results} == {"running"}
    assert len({str(r.cell) for r in results}) == 1
    assert len(_cell_dirs(tmp_path)) == 1
    await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_two_replicas_sharing_the_store_resume_and_snapshot_once(make_manager, tmp_path):
    """Two managers over one store (on Redis: two replicas): of two resumes one starts a
    cell, the other waits and gets the same sandbox; snapshots taken together are serial."""
    one, two = await _started(make_manager), await _started(make_manager)
    record = await one.create_sandbox("alice")
    await one.persistence.pause(record.id)
    resumes = (m.persistence.resume(record.id) for m in (one, two))
    a, b = await asyncio.gather(*resumes)
    assert a.cell == b.cell and len(_cell_dirs(tmp_path)) == 1
    snaps = await asyncio.gather(
        one.snapshots.take("alice", record.id), two.snapshots.take("alice", record.id)
    )
    assert len({s.id for s in snaps}) == 2 and all(s.size_bytes > 0 for s in snaps)
    assert (await one.store.get_sandbox(record.id)).state == "running"
    for snap in snaps:
        await one.snapshots.delete(snap)
    await one.delete_sandbox(record.id)
    await one.stop()
    await two.stop()


async def test_idle_timeout_with_on_timeout_pause_pauses(make_manager, tmp_path):
    manager = await _started(make_manager, default={"paused_ttl_s": 60})
    kept = await manager.create_sandbox("alice", on_timeout="pause")
    gone = await manager.create_sandbox("alice")
    with await session_client(manager, kept.id) as client:
        client.exec("echo still > here.txt")
    later = time.time() + 10_000
    reaped = await manager.reap_once(now=later)
    assert set(reaped) == {kept.id, gone.id}
    assert await manager.store.get_sandbox(gone.id) is None
    paused = await manager.store.get_sandbox(kept.id)
    assert paused is not None and paused.state == "paused"
    assert paused.expires_at == pytest.approx(time.time() + 60, abs=5)
    await manager.persistence.resume(kept.id)
    with await session_client(manager, kept.id) as client:
        assert client.exec("cat here.txt")["stdout"] == "still\n"
    # Paused past its paused TTL: deleted, workspace and all.
    await manager.persistence.pause(kept.id)
    await manager.reap_once(now=time.time() + 61)
    assert await manager.store.get_sandbox(kept.id) is None
    assert not Path(paused.workspace).exists()
    assert _cell_dirs(tmp_path) == []
    await manager.stop()


async def test_restart_mid_pause_and_mid_resume_ends_paused(make_manager, tmp_path):
    """A manager that died mid-move (record still `pausing` / `resuming`, the workspace in a
    cell or at home): the next start settles both as paused, never both nor neither."""
    manager = await _started(make_manager)
    mid_pause = await manager.create_sandbox("alice")
    mid_resume = await manager.create_sandbox("alice")
    for record in (mid_pause, mid_resume):
        with await session_client(manager, record.id) as client:
            client.exec(f"echo {record.id} > id.txt")
    # Died right after the state changed: the cell still runs with the workspace in it.
    home = manager.backend.workspace_home(mid_pause.id)
    pausing = dataclasses.replace(mid_pause, state="pausing", workspace=home)
    assert await manager.store.transition(pausing, ("running",))
    # Died after the new cell took the workspace, before the record named the cell.
    await manager.persistence.pause(mid_resume.id)
    paused = await manager.store.get_sandbox(mid_resume.id)
    resuming = dataclasses.replace(paused, state="resuming")
    assert await manager.store.transition(resuming, ("paused",))
    template = manager.templates["default"]
    await manager.prepare(template, sandbox_id=mid_resume.id, workspace=paused.workspace)
    assert not Path(paused.workspace).exists()
    await manager.stop()

    restarted = await _started(make_manager)
    for record in (mid_pause, mid_resume):
        settled = await restarted.store.get_sandbox(record.id)
        assert settled is not None and settled.state == "paused"
        assert Path(settled.workspace).exists()
    assert _cell_dirs(tmp_path) == []
    for record in (mid_pause, mid_resume):
        await restarted.persistence.resume(record.id)
        with await session_client(restarted, record.id) as client:
            assert client.exec("cat id.txt")["stdout"] == f"{record.id}\n"
        await restarted.delete_sandbox(record.id)
    await restarted.stop()


def _memory_limit(cgroup_parent: str, tmp_path: Path, cell_id: str) -> int:
    cells = LocalCells(tmp_path / "cells", cgroup_parent=cgroup_parent)
    info = cells._read_info(tmp_path / "cells" / cell_id)
    cg = cells.cgroups.open(info.cgroup)
    for d in cg.dirs:
        for name in ("memory.limit_in_bytes", "memory.max"):
            if os.path.exists(os.path.join(d, name)):
                return int(Path(d, name).read_text())
    raise AssertionError("no memory limit file")


async def test_resources_within_the_template_max_and_kept_across_resume(
    make_manager, tmp_path, cgroup_parent
):
    manager = await _started(make_manager, default={"max_memory_mb": 384, "max_cpus": 2})
    with pytest.raises(ServiceError) as info:
        await manager.create_sandbox("alice", resources={"memory_mb": 385})
    assert info.value.status == 400 and info.value.details["field"] == "resources.memory_mb"
    with pytest.raises(ServiceError):
        await manager.create_sandbox("alice", resources={"disk_mb": 65})  # no max: the default
    record = await manager.create_sandbox("alice", resources={"memory_mb": 320, "cpus": 1.5})
    assert record.resources == {"cpus": 1.5, "memory_mb": 320, "disk_mb": 64}
    assert _memory_limit(cgroup_parent, tmp_path, record.cell["cell_id"]) == 320 * 1024**2
    await manager.persistence.pause(record.id)
    resumed = await manager.persistence.resume(record.id)
    assert _memory_limit(cgroup_parent, tmp_path, resumed.cell["cell_id"]) == 320 * 1024**2
    await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_a_tenant_symlink_to_a_host_file_survives_resume_without_a_chown(
    make_manager, tmp_path
):
    """Resume hands the workspace's files to the new cell's uid: a link the tenant planted
    to a host path is chowned itself, never the host file it names."""
    host_file = tmp_path / "host-secret"
    host_file.write_text("root's")
    os.chown(host_file, 0, 0)
    manager = await _started(make_manager)
    record = await manager.create_sandbox("alice")
    with await session_client(manager, record.id) as client:
        client.exec(f"ln -s {host_file} link; ln -s {tmp_path} dirlink")
    await manager.persistence.pause(record.id)
    await manager.persistence.resume(record.id)
    assert (host_file.stat().st_uid, host_file.stat().st_gid) == (0, 0)
    assert tmp_path.stat().st_uid == 0
    with await session_client(manager, record.id) as client:
        assert client.exec("cat link 2>/dev/null || echo unreadable")["stdout"] == "unreadable\n"
    await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_pauses_past_the_keys_paused_bound_are_409_and_keep_running(make_manager):
    """Four of one key's sandboxes paused at once under a bound of two: two are paused, two
    refused (409) and still running; another key's pause is not counted against it."""
    manager = await _started(make_manager)
    manager.max_paused_per_key = 2
    records = [await manager.create_sandbox("alice") for _ in range(4)]
    other = await manager.create_sandbox("bob")
    outcomes = await asyncio.gather(
        *(manager.persistence.pause(r.id) for r in records), return_exceptions=True
    )
    paused = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(paused) == 2 and len(refused) == 2, outcomes
    for error in refused:
        assert isinstance(error, ServiceError) and error.status == 409
        assert error.code == "CONFLICT" and error.details["max_paused_per_key"] == 2
        assert (await manager.store.get_sandbox(error.details["sandbox_id"])).state == "running"
        with await session_client(manager, error.details["sandbox_id"]) as client:
            assert client.exec("echo alive")["stdout"] == "alive\n"
    assert (await manager.persistence.pause(other.id)).state == "paused"
    # A resumed one frees its place; so does a deleted one.
    await manager.persistence.resume(paused[0].id)
    assert (await manager.persistence.pause(refused[0].details["sandbox_id"])).state == "paused"
    with pytest.raises(ServiceError):
        await manager.persistence.pause(refused[1].details["sandbox_id"])
    await manager.delete_sandbox(paused[1].id)
    assert (await manager.persistence.pause(refused[1].details["sandbox_id"])).state == "paused"
    for record in [*records, other]:
        await manager.delete_sandbox(record.id)
    await manager.stop()


async def test_on_timeout_pause_past_the_bound_deletes_at_the_timeout(make_manager, tmp_path):
    """Its deadline bounds what runs and the paused bound what is kept: neither gives way,
    so a sandbox that cannot be paused at its timeout is deleted, workspace and all."""
    manager = await _started(make_manager)
    manager.max_paused_per_key = 1
    first = await manager.create_sandbox("alice", on_timeout="pause")
    second = await manager.create_sandbox("alice", on_timeout="pause")
    await manager.persistence.pause(first.id)
    reaped = await manager.reap_once(now=time.time() + 10_000)
    assert reaped == [second.id]
    assert await manager.store.get_sandbox(second.id) is None
    assert not Path(manager.backend.workspace_home(second.id)).exists()
    assert (await manager.store.get_sandbox(first.id)).state == "paused"
    assert _cell_dirs(tmp_path) == []
    await manager.delete_sandbox(first.id)
    await manager.stop()


async def test_a_paused_image_holds_only_what_its_files_do(make_manager, tmp_path):
    """A 1 GiB workspace with 1 MB of files, after 200 MB were written and deleted: paused,
    its image is still 1 GiB long but holds a few MiB (the freed blocks given back, nothing
    densified); so do a snapshot of it and a sandbox started from that snapshot, paused."""
    manager = await _started(make_manager, default={"disk_mb": 1024})
    record = await manager.create_sandbox("alice")
    with await session_client(manager, record.id) as client:
        script = "head -c 1000000 /dev/urandom > kept; head -c 200000000 /dev/urandom > gone"
        client.exec(f"{script}; sync; rm gone", timeout_s=60)
    paused = await manager.persistence.pause(record.id)
    image = os.stat(paused.workspace)
    assert image.st_size == 1024 * 1024 * 1024
    assert image.st_blocks * 512 < 8 * 1024 * 1024, image.st_blocks
    snap = await manager.snapshots.take("alice", record.id)
    assert os.stat(snap.path).st_blocks * 512 < 8 * 1024 * 1024
    assert snap.size_bytes < 8 * 1024 * 1024
    child = await manager.create_sandbox("alice", snapshot=snap)
    with await session_client(manager, child.id) as client:
        assert client.exec("wc -c < kept")["stdout"] == "1000000\n"
    child_paused = await manager.persistence.pause(child.id)
    assert os.stat(child_paused.workspace).st_blocks * 512 < 8 * 1024 * 1024
    await manager.snapshots.delete(snap)
    for sandbox in (record, child):
        await manager.delete_sandbox(sandbox.id)
    await manager.stop()
