"""Reading the trail (both stores): records of every writer by sandbox, action, principal and
time range, oldest first, a page at a time."""

from __future__ import annotations

import pytest

from sandcell.audit.chain import AuditLog
from sandcell.audit.records import AuditQuery, AuditRecord, file_detail
from sandcell.store import Store

pytestmark = pytest.mark.anyio


async def _trail(store: Store) -> list[AuditRecord]:
    """Two writers, interleaved in time: router-a at 100, 102, ..., node-1 at 101, 103, ..."""
    clocks = {"router-a": iter(range(100, 200, 2)), "node-1": iter(range(101, 200, 2))}
    logs = [AuditLog(store, w, clock=c.__next__) for w, c in clocks.items()]
    made = []
    for i in range(10):
        for log in logs:
            made.append(
                await log.append(
                    "file.write" if i % 2 else "exec",
                    principal="alice" if i < 5 else "bob",
                    key_name="k",
                    sandbox_id=f"sbx-{i % 3}",
                    touched=file_detail(path=f"/tmp/{i}", size=i),
                )
            )
    return sorted(made, key=lambda r: r.at)


async def test_filters_select_and_order_by_time(store: Store) -> None:
    made = await _trail(store)
    everything = await store.list_audit(AuditQuery(limit=1000))
    assert everything.records == made and everything.next is None
    for query, keep in (
        (AuditQuery(sandbox_id="sbx-1"), lambda r: r.sandbox_id == "sbx-1"),
        (AuditQuery(action="exec"), lambda r: r.action == "exec"),
        (AuditQuery(principal="bob"), lambda r: r.principal == "bob"),
        (AuditQuery(since=105, until=111), lambda r: 105 <= r.at < 111),
        (
            AuditQuery(sandbox_id="sbx-0", action="exec", since=100),
            lambda r: r.action == "exec" and r.sandbox_id == "sbx-0",
        ),
    ):
        assert (await store.list_audit(query)).records == [r for r in made if keep(r)]
    assert (await store.list_audit(AuditQuery(sandbox_id="sbx-none"))).records == []


async def test_pages_cover_everything_once(store: Store) -> None:
    made = await _trail(store)
    seen: list[AuditRecord] = []
    cursor = None
    while True:
        page = await store.list_audit(AuditQuery(action="exec", after=cursor, limit=3))
        seen += page.records
        if page.next is None:
            break
        cursor = page.next
    assert seen == [r for r in made if r.action == "exec"]
    assert len(seen) == 10


async def test_pages_of_one_principal_across_writers_with_ties(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three writers whose clocks tie (four records an instant), two principals, many more
    records than a page or the Redis index's read: every page in order, none twice."""
    monkeypatch.setattr("sandcell.store.redis.AUDIT_SCAN", 5)
    for writer in ("router-a", "router-b", "node-1"):
        log = AuditLog(store, writer, clock=iter([1000.0 + i // 4 for i in range(60)]).__next__)
        for i in range(60):
            await log.append("exec", principal="alice" if i % 3 else "bob", key_name="k")
    for principal in ("alice", "bob"):
        whole = (await store.list_audit(AuditQuery(principal=principal, limit=1000))).records
        assert len(whole) == 3 * (40 if principal == "alice" else 20)
        assert whole == sorted(whole, key=lambda r: (r.at, r.writer, r.seq))
        seen: list[AuditRecord] = []
        cursor = None
        while True:
            query = AuditQuery(principal=principal, after=cursor, limit=7, since=1002.0)
            page = await store.list_audit(query)
            seen += page.records
            if page.next is None:
                break
            cursor = page.next
        assert seen == [r for r in whole if r.at >= 1002.0]
