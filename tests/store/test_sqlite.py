"""What only the SQLite backend promises: file mode, schema, indexes, threads."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from sandcell.store import Sealer, open_store
from sandcell.store.sqlite import SCHEMA_VERSION, SQLiteStore

from .helpers import T0, make_sandbox


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "store.db"


def test_files_are_private_whatever_the_umask(db: Path, sealer: Sealer) -> None:
    old_umask = os.umask(0)
    try:
        store = open_store(f"sqlite://{db}", sealer)
        asyncio.run(store.put_sandbox(make_sandbox("s")))
    finally:
        os.umask(old_umask)
    files = [db, db.with_name("store.db-wal"), db.with_name("store.db-shm")]
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == dict.fromkeys(
        (f.name for f in files), 0o600
    )
    asyncio.run(store.close())


def test_schema_is_versioned_and_newer_is_refused(db: Path, sealer: Sealer) -> None:
    asyncio.run(SQLiteStore(db, sealer).close())
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer than this sandcell supports"):
        SQLiteStore(db, sealer)


def test_a_version_1_file_is_upgraded_in_place(db: Path, sealer: Sealer) -> None:
    """Files from before reservations and egress policies gain the table and the column,
    and keep their sandboxes."""
    store = SQLiteStore(db, sealer)
    asyncio.run(store.put_sandbox(make_sandbox("old", expires_at=time.time() + 3600)))
    asyncio.run(store.close())
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE reservations")
        conn.execute("ALTER TABLE sandboxes DROP COLUMN network")
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = SQLiteStore(db, sealer)
    old = asyncio.run(store.get_sandbox("old"))
    assert old is not None and old.network == {}
    assert asyncio.run(store.reserve_sandbox("alice", 1)) is None  # "old" holds the one slot
    assert asyncio.run(store.reserve_sandbox("alice", 2)) is not None
    asyncio.run(store.close())


def test_a_version_2_file_gains_the_persistence_columns(db: Path, sealer: Sealer) -> None:
    store = SQLiteStore(db, sealer)
    asyncio.run(store.put_sandbox(make_sandbox("old", expires_at=time.time() + 3600)))
    asyncio.run(store.close())
    with sqlite3.connect(db) as conn:
        for column in ("auto_resume", "on_timeout", "lifetime_s", "paused_at", "workspace"):
            conn.execute(f"ALTER TABLE sandboxes DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 2")
    conn.close()
    store = SQLiteStore(db, sealer)
    old = asyncio.run(store.get_sandbox("old"))
    assert old is not None and old.auto_resume and old.on_timeout == "delete"
    assert old.workspace == "" and old.paused_at == 0.0
    asyncio.run(store.close())


def test_reaper_and_owner_queries_use_indexes(db: Path, sealer: Sealer) -> None:
    asyncio.run(SQLiteStore(db, sealer).close())
    with sqlite3.connect(db) as conn:
        plans = {
            query: " ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", args))
            for query, args in [
                ("SELECT id FROM sandboxes WHERE deadline <= ? ORDER BY deadline LIMIT ?", (0, 1)),
                ("SELECT id FROM sandboxes WHERE owner = ? ORDER BY created_at, id", ("a",)),
            ]
        }
    conn.close()
    assert all("USING INDEX" in plan or "USING COVERING INDEX" in plan for plan in plans.values())


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_eight_threads_touching_at_once(db: Path, sealer: Sealer, shared: bool) -> None:
    threads, touches = 8, 200
    setup = SQLiteStore(db, sealer)
    errors: list[BaseException] = []

    async def work(i: int) -> None:
        store = setup if shared else SQLiteStore(db, sealer)
        await store.put_sandbox(make_sandbox(f"s{i}"))
        for n in range(touches):  # every write takes the one database write lock
            assert await store.touch(f"s{i}", T0 + n)
            assert await store.get_sandbox(f"s{i}") is not None
        if not shared:
            await store.close()

    def run(i: int) -> None:
        try:
            asyncio.run(work(i))
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    records = asyncio.run(setup.list_sandboxes())
    assert [r.last_activity_at for r in records] == [T0 + touches - 1] * threads
    asyncio.run(setup.close())


@pytest.mark.slow
def test_processes_opening_a_fresh_file_at_once_all_get_in(tmp_path: Path, sealer: Sealer) -> None:
    """Switching a fresh file to WAL does not wait on the busy handler: without a retry,
    about one of a thousand concurrent opens failed with "database is locked"."""
    errors: list[BaseException] = []
    for round_ in range(40):
        db = tmp_path / f"fresh-{round_}.db"
        start = threading.Barrier(16)

        def open_one(db: Path = db, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                asyncio.run(SQLiteStore(db, sealer).close())
            except BaseException as e:
                errors.append(e)

        openers = [threading.Thread(target=open_one) for _ in range(16)]
        for t in openers:
            t.start()
        for t in openers:
            t.join()
    assert errors == []
