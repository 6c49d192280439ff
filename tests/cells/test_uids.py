"""Host uids are unique across every sandcell instance on the host, not per cells dir."""

from __future__ import annotations

import secrets

from sandcell import tokens
from sandcell.isolation.cell import UID_REGISTRY, LocalCells, new_cell_id
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
