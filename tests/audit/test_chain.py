"""The chain in both stores (SQLite file, real Redis server): appended records verify clean;
a record edited, rewritten with a fresh hash, deleted or swapped behind the store's back is
named by `verify`; writers keep chains of their own; a second process under one writer id is
refused instead of forking the chain."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sqlite3
import threading
from pathlib import Path

import pytest

from sandcell.audit.chain import AuditLog
from sandcell.audit.records import GENESIS, AuditConflictError, AuditRecord, command_detail
from sandcell.audit.verify import Finding, verify_store
from sandcell.store import Sealer, Store
from sandcell.store.sqlite import SQLiteStore
from store.helpers import race

from .tamper import Tamper

pytestmark = pytest.mark.anyio


async def fill(store: Store, writer: str = "router-a", n: int = 6) -> list[AuditRecord]:
    log = AuditLog(store, writer, clock=iter(range(1000, 2000)).__next__)
    return [
        await log.append(
            "exec",
            principal="alice",
            key_name="alice-ci",
            sandbox_id=f"sbx-{i % 2}",
            touched=command_detail(f"echo {i}"),
        )
        for i in range(n)
    ]


async def findings(store: Store) -> list[tuple[str, int, str]]:
    return [(f.writer, f.seq, f.kind) for f in (await verify_store(store)).findings]


async def test_appended_records_chain_and_verify_clean(store: Store) -> None:
    records = await fill(store)
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0].prev == GENESIS
    assert all(b.prev == a.hash for a, b in itertools.pairwise(records))
    assert await store.audit_chain("router-a") == [(r.seq, r) for r in records]
    assert await store.audit_chain("router-a", after=4, limit=1) == [(5, records[4])]
    head = await store.audit_head("router-a")
    assert head is not None and (head.seq, head.hash) == (6, records[-1].hash)
    report = await verify_store(store)
    assert (report.writers, report.records, report.findings) == (1, 6, [])
    assert await store.audit_head("router-b") is None


async def test_a_log_takes_up_a_chain_where_the_store_has_it(store: Store) -> None:
    await fill(store, n=3)
    again = await fill(store, n=2)  # a restarted process under the same writer id
    assert [r.seq for r in again] == [4, 5]
    assert await findings(store) == []


async def test_an_edited_record_is_named(store: Store, tamper: Tamper) -> None:
    await fill(store)
    tamper.edit("router-a", 3, principal="mallory")
    assert await findings(store) == [("router-a", 3, "changed")]
    report = await verify_store(store)
    assert str(report.findings[0]) == (
        "audit router-a seq 3: changed: its hash does not match its contents"
    )


async def test_a_record_rewritten_with_its_hash_breaks_the_next_link(
    store: Store, tamper: Tamper
) -> None:
    await fill(store)
    tamper.rewrite("router-a", 3, sandbox_id="sbx-other")
    assert await findings(store) == [("router-a", 4, "unlinked")]


async def test_the_last_record_rewritten_differs_from_the_head(
    store: Store, tamper: Tamper
) -> None:
    await fill(store)
    tamper.rewrite("router-a", 6, outcome="refused", status=403)
    assert await findings(store) == [("router-a", 6, "head")]


async def test_a_value_that_is_no_record_and_one_past_the_head_are_named(
    store: Store, tamper: Tamper
) -> None:
    records = await fill(store)
    tamper.edit("router-a", 2, action="sandbox.explode")
    beyond = dataclasses.replace(records[-1], seq=7, prev=records[-1].hash).sealed()
    tamper.add(beyond)
    assert await findings(store) == [("router-a", 2, "unreadable"), ("router-a", 7, "extra")]


async def test_a_deleted_record_is_named(store: Store, tamper: Tamper) -> None:
    await fill(store)
    tamper.delete("router-a", 2)
    tamper.delete("router-a", 3)
    tamper.delete("router-a", 6)
    report = await verify_store(store)
    assert [str(f) for f in report.findings] == [
        "audit router-a seq 2: removed: seqs 2 to 3 missing",
        "audit router-a seq 6: removed: seq 6 missing (the chain's end: the head records seq 6)",
    ]


async def test_swapped_records_are_named(store: Store, tamper: Tamper) -> None:
    await fill(store)
    tamper.swap("router-a", 3, 4)
    report = await verify_store(store)
    assert [str(f) for f in report.findings] == [
        "audit router-a seq 3: reordered: holds the record of seq 4",
        "audit router-a seq 4: reordered: holds the record of seq 3",
    ]


async def test_interleaved_writers_each_verify_and_findings_name_the_writer(
    store: Store, tamper: Tamper
) -> None:
    a, b = AuditLog(store, "router-a"), AuditLog(store, "node-1")
    for _ in range(5):
        for log in (a, b):
            await log.append("file.write", principal="bob", key_name="bob", sandbox_id="s")
    assert await store.audit_writers() == ["node-1", "router-a"]
    assert [(await store.audit_head(w)).seq for w in ("node-1", "router-a")] == [5, 5]  # type: ignore[union-attr]
    assert await findings(store) == []
    tamper.edit("node-1", 2, action="file.read")
    assert await findings(store) == [("node-1", 2, "changed")]


async def test_an_append_that_does_not_follow_the_head_is_refused(store: Store) -> None:
    records = await fill(store, n=2)
    stale = dataclasses.replace(records[1], at=5.0).sealed()  # seq 2 again
    with pytest.raises(AuditConflictError, match="'router-a' is at seq 2: seq 2 does not"):
        await store.append_audits([stale])
    fork = dataclasses.replace(records[1], seq=3, prev=records[0].hash).sealed()
    with pytest.raises(AuditConflictError):
        await store.append_audits([fork])  # the right seq, the wrong prev
    assert await store.audit_chain("router-a") == [(r.seq, r) for r in records]


def test_two_processes_under_one_writer_id_cannot_fork_the_chain(
    store_url: str, sealer: Sealer
) -> None:
    loaded = threading.Barrier(2, timeout=10)

    async def replica(store: Store, i: int) -> tuple[int, bool]:
        log = AuditLog(store, "router-a")
        await log.load()
        loaded.wait()  # both start from the same head
        done = 0
        try:
            for _ in range(20):
                await log.append("exec", principal=f"p{i}", key_name="k")
                done += 1
        except AuditConflictError:
            return done, True
        return done, False

    results = race(store_url, sealer, 2, replica)
    assert sorted(results) == [(0, True), (20, False)]

    async def check(store: Store, _: int) -> list[Finding]:
        head = await store.audit_head("router-a")
        assert head is not None and head.seq == 20
        return (await verify_store(store)).findings

    assert race(store_url, sealer, 1, check) == [[]]


def test_an_older_sqlite_file_gains_the_audit_tables(tmp_path: Path, sealer: Sealer) -> None:
    path = tmp_path / "store.db"
    SQLiteStore(path, sealer)._conn.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE audit_records")
        conn.execute("DROP TABLE audit_heads")
        conn.execute("PRAGMA user_version = 6")
    conn.close()

    async def use() -> list[Finding]:
        async with SQLiteStore(path, sealer) as store:
            await fill(store, n=2)
            return (await verify_store(store)).findings

    assert asyncio.run(use()) == []
