"""Host uids are unique across every sandcell instance on the host, not per cells dir."""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

from sandcell import tokens
from sandcell.isolation.cell import (
    DEFAULT_UID_BASE,
    DEFAULT_UID_COUNT,
    UID_REGISTRY,
    LocalCells,
    new_cell_id,
)
from sandcell.isolation.policy import CellPolicy
from support.cells import cleanup_cgroup_parent


def test_two_instances_never_share_a_uid(tmp_path):
    parent = f"sandcell-test-{secrets.token_hex(3)}"
    pem = tokens.public_pem(tokens.generate_p256())
    first = LocalCells(tmp_path / "a", cgroup_parent=parent)
    second = LocalCells(tmp_path / "b", cgroup_parent=parent)
    policy = CellPolicy(memory_mb=128, pids_max=32, disk_mb=32)
    ids = (new_cell_id(), new_cell_id())
    try:
        a = first.create(ids[0], policy, "sbx-a", pem)
        b = second.create(ids[1], policy, "sbx-b", pem)
        assert a.uid != b.uid
        assert (UID_REGISTRY / str(a.uid)).read_text() == str(tmp_path / "a" / ids[0])
    finally:
        first.destroy(ids[0])
        second.destroy(ids[1])
        cleanup_cgroup_parent(parent)
    assert not (UID_REGISTRY / str(a.uid)).exists()
    assert not (UID_REGISTRY / str(b.uid)).exists()


def test_a_uid_some_process_still_runs_as_is_never_handed_out(tmp_path):
    """A cell whose directory was removed from under it can outlive its claim; the next
    cell must not share that uid with it (claim or no claim)."""
    top = DEFAULT_UID_BASE + DEFAULT_UID_COUNT - 1  # far from where other sandcells claim
    base = next(
        u
        for u in range(top - 1, top - 100, -1)
        if not (UID_REGISTRY / str(u)).exists() and not (UID_REGISTRY / str(u + 1)).exists()
    )
    orphan = subprocess.Popen(["sleep", "60"], user=base, group=base)
    parent = f"sandcell-test-{secrets.token_hex(3)}"
    cells = LocalCells(tmp_path / "cells", cgroup_parent=parent, uid_base=base, uid_count=2)
    cell_id = new_cell_id()
    try:
        info = cells.create(cell_id, CellPolicy(memory_mb=128, disk_mb=16), "sbx-u", _pem())
        assert info.uid == base + 1
        assert not (UID_REGISTRY / str(base)).exists()  # the skipped uid is not kept claimed
    finally:
        orphan.kill()
        orphan.wait()
        cells.destroy(cell_id)
        cleanup_cgroup_parent(parent)


def _pem() -> bytes:
    return tokens.public_pem(tokens.generate_p256())


def test_a_zombie_does_not_hold_its_uid(tmp_path):
    """An exited process its parent has not reaped yet runs nothing: its uid is free."""
    top = DEFAULT_UID_BASE + DEFAULT_UID_COUNT - 1
    base = next(u for u in range(top, top - 100, -1) if not (UID_REGISTRY / str(u)).exists())
    zombie = subprocess.Popen(["true"], user=base, group=base)  # not waited for: a zombie
    stat = Path(f"/proc/{zombie.pid}/stat")
    deadline = time.monotonic() + 5
    while stat.read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    parent = f"sandcell-test-{secrets.token_hex(3)}"
    cells = LocalCells(tmp_path / "cells", cgroup_parent=parent, uid_base=base, uid_count=1)
    cell_id = new_cell_id()
    try:
        info = cells.create(cell_id, CellPolicy(memory_mb=128, disk_mb=16), "sbx-z", _pem())
        assert info.uid == base
    finally:
        zombie.wait()
        cells.destroy(cell_id)
        cleanup_cgroup_parent(parent)
