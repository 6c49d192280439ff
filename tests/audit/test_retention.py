"""Retention (both stores): pruned by count or by age, a chain still verifies from its anchor,
goes on growing, and still shows a record removed after the anchor."""

from __future__ import annotations

import pytest

from sandcell.audit.chain import AuditLog
from sandcell.audit.retention import prune
from sandcell.audit.verify import verify_store
from sandcell.store import Store

from .tamper import Tamper

pytestmark = pytest.mark.anyio


async def _fill(store: Store, writer: str, times: range) -> AuditLog:
    log = AuditLog(store, writer, clock=iter(times).__next__)
    for _ in times:
        await log.append("exec", principal="alice", key_name="k")
    return log


async def test_prune_by_count_keeps_the_last_and_verifies(store: Store, tamper: Tamper) -> None:
    await _fill(store, "router-a", range(100, 110))
    await _fill(store, "node-1", range(100, 103))
    assert await prune(store, max_records=4) == {"node-1": 0, "router-a": 6}
    assert [seq for seq, _ in await store.audit_chain("router-a")] == [7, 8, 9, 10]
    head = await store.audit_head("router-a")
    assert head is not None and head.anchor_seq == 7
    assert (await verify_store(store)).findings == []
    assert await prune(store, max_records=4) == {"node-1": 0, "router-a": 0}  # idempotent
    tamper.delete("router-a", 7)  # the first record kept is still evidence
    assert [(f.seq, f.kind) for f in (await verify_store(store)).findings] == [(7, "removed")]


async def test_prune_by_age_then_the_chain_goes_on(store: Store) -> None:
    await _fill(store, "router-a", range(100, 110))
    assert await prune(store, max_age_s=3.5, now=110) == {"router-a": 7}  # keeps at >= 106.5
    assert [rec.at for _, rec in await store.audit_chain("router-a") if rec] == [107, 108, 109]
    later = AuditLog(store, "router-a", clock=lambda: 110.0)
    await later.append("sandbox.delete", principal="alice", key_name="k", sandbox_id="s")
    assert (await verify_store(store)).findings == []
    assert await prune(store, max_age_s=0, now=1000) == {"router-a": 4}  # all of it
    assert await store.audit_chain("router-a") == []
    assert (await verify_store(store)).findings == []
    rec = await AuditLog(store, "router-a").append("exec", principal="a", key_name="k")
    assert rec.seq == 12
    assert (await verify_store(store)).findings == []
