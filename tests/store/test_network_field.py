"""The egress policy travels with the sandbox record, and a live change is one field write."""

from __future__ import annotations

import pytest

from sandcell.store import SandboxRecord

pytestmark = pytest.mark.anyio


def record(sandbox_id: str = "sbx-1", **kw) -> SandboxRecord:
    return SandboxRecord(sandbox_id, "alice", "default", "running", 1.0, 100.0, 60, 1.0, **kw)


async def test_policy_round_trip_and_live_update(store):
    await store.put_sandbox(record(network={"egress": "allowlist", "allow": ["pypi.org"]}))
    got = await store.get_sandbox("sbx-1")
    assert got.network == {"egress": "allowlist", "allow": ["pypi.org"]}
    assert await store.set_network("sbx-1", {"egress": "none", "allow": [], "deny": []})
    assert (await store.get_sandbox("sbx-1")).network["egress"] == "none"
    assert not await store.set_network("sbx-gone", {"egress": "open"})
    assert await store.get_sandbox("sbx-gone") is None
