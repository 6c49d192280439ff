"""A deletion answers once the sandbox is gone for its owner; the teardown follows in the
background (real cells, real SQLite and Redis stores)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

from sandcell.isolation import cgroups
from sandcell.manager.manager import Manager
from sandcell.store import SandboxRecord
from support.sessions import session_client

pytestmark = pytest.mark.anyio

SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _cell_dirs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cells").iterdir())


def _survivors(cgroup_parent: str, record: SandboxRecord) -> list[int]:
    """The cell's processes that could still run code: alive, not a zombie, and no SIGKILL
    pending (a pending SIGKILL is taken before the process returns to user space)."""
    cell = cgroups.detect(cgroup_parent).open(f"cell-{record.cell['cell_id']}")
    assert cell is not None  # still there: the teardown has not got that far
    alive = []
    for pid in cell.pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
        if not fields["State"].startswith("Z") and not pending & SIGKILL_BIT:
            alive.append(pid)
    return alive


async def _running_sandbox(manager: Manager) -> SandboxRecord:
    record = await manager.create_sandbox("alice")
    with await session_client(manager, record.id) as client:
        # Background work that would outlive a deletion that only stopped the daemon.
        client.exec("nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &")
    return record


async def test_delete_answers_with_processes_killed_then_tears_down(
    make_manager, tmp_path, cgroup_parent
):
    manager = await make_manager()
    record = await _running_sandbox(manager)
    assert await manager.delete_sandbox(record.id, wait=False) is True
    # Answered: nothing of the cell runs code any more, the record hides it from its owner
    # and frees its slot, while the cell is still being taken apart.
    assert _survivors(cgroup_parent, record) == []
    gone = await manager.store.get_sandbox(record.id)
    assert gone is None or gone.state == "deleted"
    assert await manager.store.reserve_sandbox("alice", 1) is not None
    assert await manager.delete_sandbox(record.id) is False  # a second deletion: nothing to do
    await manager.wait_teardowns()
    assert await manager.store.get_sandbox(record.id) is None
    assert await manager.store.get_session_key(record.id) is None
    assert _cell_dirs(tmp_path) == []


async def test_failed_teardown_is_logged_and_retried_by_the_reaper(
    make_manager, tmp_path, caplog, monkeypatch
):
    manager = await make_manager()
    record = await manager.create_sandbox("alice")
    destroy = manager.backend.destroy

    async def fails_once(cell: dict) -> None:
        monkeypatch.setattr(manager.backend, "destroy", destroy)
        raise OSError("umount: target is busy")

    monkeypatch.setattr(manager.backend, "destroy", fails_once)
    with caplog.at_level(logging.WARNING, "sandcell.manager"):
        assert await manager.delete_sandbox(record.id, wait=False) is True
        await manager.wait_teardowns()
    assert f"sandbox {record.id}: teardown failed: OSError" in caplog.text
    assert (await manager.store.get_sandbox(record.id)).state == "deleted"
    assert _cell_dirs(tmp_path) == [record.cell["cell_id"]]
    assert await manager.delete_sandbox(record.id) is False  # still gone for everyone
    assert await manager.reap_once() == [record.id]
    assert await manager.store.get_sandbox(record.id) is None
    assert _cell_dirs(tmp_path) == []


async def test_stop_waits_for_teardowns_under_way(make_manager, tmp_path):
    manager = await make_manager()
    await manager.start()
    records = [await manager.create_sandbox("alice") for _ in range(3)]
    for record in records:
        assert await manager.delete_sandbox(record.id, wait=False) is True
    await manager.stop()  # graceful shutdown, right behind the deletions
    assert _cell_dirs(tmp_path) == []
    assert await manager.store.list_sandboxes() == []


async def test_restart_finishes_deletions_instead_of_adopting(make_manager, tmp_path):
    """A crash between the answer and the teardown (or before the answer) leaves a record
    that says so: the next start tears the cell down, even though its daemon may be alive."""
    first = await make_manager()
    deleted = await first.create_sandbox("alice")
    deleting = await first.create_sandbox("alice")
    assert await first.store.update_state(deleted.id, "deleted")
    assert await first.store.update_state(deleting.id, "deleting")
    second = await make_manager()
    found = await second.reconcile()
    assert sorted(found["dropped"]) == sorted([deleted.id, deleting.id])
    assert found["adopted"] == []
    assert await second.store.list_sandboxes() == []
    assert _cell_dirs(tmp_path) == []
