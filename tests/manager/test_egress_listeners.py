"""The egress listeners follow their cells, whichever replica on the host destroys them."""

from __future__ import annotations

import pytest

from sandcell import tokens
from sandcell.isolation.policy import CellPolicy
from sandcell.manager.backend import LocalBackend
from sandcell.network.egress import EgressService
from sandcell.network.policy import NONE, NetworkPolicy
from support.cells import cleanup_cgroup_parent

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
POLICY = CellPolicy(memory_mb=256, pids_max=64, disk_mb=64, network="loopback")


async def _none(_: str) -> NetworkPolicy:
    return NONE


async def test_a_neighbours_delete_closes_this_replicas_listeners(tmp_path, cgroup_parent):
    egress = EgressService(_none)
    mine = LocalBackend(tmp_path / "a", cgroup_parent=cgroup_parent, egress=egress)
    neighbour = LocalBackend(tmp_path / "b", cgroup_parent=cgroup_parent)
    pem = tokens.public_pem(tokens.generate_p256())
    try:
        first = await mine.create(POLICY, "sbx-first", pem)
        assert egress.served == {"sbx-first"}
        await neighbour.destroy(first.cell)  # the user's delete landed on the other replica
        second = await mine.create(POLICY, "sbx-second", pem)
        assert egress.served == {"sbx-second"}
        await mine.destroy(second.cell)
        assert egress.served == set()
    finally:
        mine.cells.destroy_all()
        await egress.close()
        cleanup_cgroup_parent(cgroup_parent)
