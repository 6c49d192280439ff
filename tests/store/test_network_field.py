"""The egress policy travels with the sandbox record, and a live change is one field write."""

from __future__ import annotations

import sqlite3

import pytest

from sandcell.store import SandboxRecord, open_store
from sandcell.store.sqlite import SCHEMA_VERSION

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


async def test_a_version_1_sqlite_file_gains_the_column(tmp_path, sealer):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, template TEXT NOT NULL,"
        " state TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,"
        " idle_timeout_s INTEGER NOT NULL, last_activity_at REAL NOT NULL, metadata TEXT NOT NULL,"
        " env TEXT NOT NULL, backend TEXT NOT NULL, endpoint TEXT NOT NULL, cell TEXT NOT NULL,"
        " session_key BLOB) STRICT;"
        "INSERT INTO sandboxes VALUES ('sbx-old','a','default','running',1,2,3,1,'{}','{}','local',"
        "'{}','{}',NULL);"
        "PRAGMA user_version = 1;"
    )
    conn.close()
    async with open_store(f"sqlite://{path}", sealer) as store:
        assert (await store.get_sandbox("sbx-old")).network == {}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
