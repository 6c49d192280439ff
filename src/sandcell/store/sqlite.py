"""SQLite backend: the embedded default, one file in the data dir, for a single server process.

Every call is one indexed statement on a local file that completes in well under a millisecond,
so it runs inline in the coroutine: a thread hop per call would cost more than the work and
would need a dependency such as aiosqlite. WAL mode lets readers proceed beside the writer, and
`busy_timeout` bounds the wait when another process (say `sandcell keys create`) holds the
write lock. One connection, guarded by a lock, serves every thread and task of the process.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandcell.audit.records import FIELDS as AUDIT_FIELDS
from sandcell.audit.records import (
    GENESIS,
    AuditConflictError,
    AuditHead,
    AuditPage,
    AuditQuery,
    AuditRecord,
    page_of,
    parse_cursor,
)

from .base import (
    SESSION_KEY_FIELD,
    USER_SECRET_VALUE_FIELD,
    ApiKeyExistsError,
    ByteReservation,
    FieldValue,
    PauseStart,
    Reservation,
    SecretPut,
    Store,
)
from .crypto import Sealer
from .records import (
    PARKED_STATES,
    PAUSED_STATES,
    ApiKeyRecord,
    NodeRecord,
    NodeState,
    SandboxRecord,
    SnapshotRecord,
    UserSecretRecord,
)

# Kept in PRAGMA user_version; 2 added `reservations` and `network`, 3 the persistence columns,
# 4 `snapshot_reservations`, 5 `user_secrets` and the sandboxes' `secrets`, 6 `nodes`,
# 7 `audit_records` and `audit_heads`.
SCHEMA_VERSION = 7
# Older files gain the new columns here; new tables come from _SCHEMA (IF NOT EXISTS).
_ADDED_COLUMNS = {
    "network": "TEXT NOT NULL DEFAULT '{}'",
    "auto_resume": "INTEGER NOT NULL DEFAULT 1",
    "on_timeout": "TEXT NOT NULL DEFAULT 'delete'",
    "lifetime_s": "INTEGER NOT NULL DEFAULT 0",
    "paused_at": "REAL NOT NULL DEFAULT 0",
    "workspace": "TEXT NOT NULL DEFAULT ''",
    "resources": "TEXT NOT NULL DEFAULT '{}'",
    "secrets": "TEXT NOT NULL DEFAULT '{}'",
}
BUSY_TIMEOUT_MS = 5000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id               TEXT PRIMARY KEY,
    owner            TEXT NOT NULL,
    template         TEXT NOT NULL,
    state            TEXT NOT NULL,
    created_at       REAL NOT NULL,
    expires_at       REAL NOT NULL,
    idle_timeout_s   INTEGER NOT NULL,
    last_activity_at REAL NOT NULL,
    metadata         TEXT NOT NULL,  -- JSON
    env              TEXT NOT NULL,  -- JSON
    backend          TEXT NOT NULL,
    endpoint         TEXT NOT NULL,  -- JSON
    cell             TEXT NOT NULL,  -- JSON
    network          TEXT NOT NULL DEFAULT '{}',  -- JSON, since version 2
    auto_resume      INTEGER NOT NULL DEFAULT 1,  -- these six since version 3
    on_timeout       TEXT NOT NULL DEFAULT 'delete',
    lifetime_s       INTEGER NOT NULL DEFAULT 0,
    paused_at        REAL NOT NULL DEFAULT 0,
    workspace        TEXT NOT NULL DEFAULT '',
    resources        TEXT NOT NULL DEFAULT '{}',  -- JSON
    secrets          TEXT NOT NULL DEFAULT '{}',  -- JSON name -> placeholder, since version 5
    session_key      BLOB,           -- sealed; in the row, so deleting the row deletes the key
    -- SandboxRecord.deadline, maintained by SQLite so that touch is a plain UPDATE
    deadline         REAL GENERATED ALWAYS AS
                         (MIN(expires_at, last_activity_at + idle_timeout_s)) STORED
) STRICT;
CREATE INDEX IF NOT EXISTS sandboxes_by_deadline ON sandboxes (deadline);
CREATE INDEX IF NOT EXISTS sandboxes_by_owner ON sandboxes (owner, created_at);
CREATE TABLE IF NOT EXISTS api_keys (
    name       TEXT PRIMARY KEY,
    principal  TEXT NOT NULL,
    key_hash   TEXT NOT NULL UNIQUE,
    admin      INTEGER NOT NULL,
    created_at REAL NOT NULL,
    revoked    INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS reservations (  -- sandbox slots held by creates in flight
    token TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    until REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS reservations_by_owner ON reservations (owner);
CREATE TABLE IF NOT EXISTS snapshots (  -- since version 3
    id         TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    name       TEXT NOT NULL,
    template   TEXT NOT NULL,
    created_at REAL NOT NULL,
    size_bytes INTEGER NOT NULL,
    path       TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS snapshots_by_owner ON snapshots (owner, created_at);
CREATE TABLE IF NOT EXISTS snapshot_reservations (  -- quota bytes held by copies in flight (4)
    token TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    size  INTEGER NOT NULL,
    until REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS snapshot_reservations_by_owner ON snapshot_reservations (owner);
CREATE TABLE IF NOT EXISTS secrets (  -- the manager's own
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL  -- sealed
) STRICT;
CREATE TABLE IF NOT EXISTS user_secrets (  -- principals' secrets (SPEC §17), since version 5
    owner      TEXT NOT NULL,
    name       TEXT NOT NULL,
    hosts      TEXT NOT NULL,  -- JSON
    places     TEXT NOT NULL,  -- JSON
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    value      BLOB NOT NULL,  -- sealed, bound to owner and name
    PRIMARY KEY (owner, name)
) STRICT;
CREATE TABLE IF NOT EXISTS nodes (  -- the node roster (SPEC §18), since version 6
    name           TEXT PRIMARY KEY,
    address        TEXT NOT NULL,
    version        TEXT NOT NULL,
    heartbeat_at   REAL NOT NULL,
    memory_mb      INTEGER NOT NULL,
    cpus           REAL NOT NULL,
    cells          INTEGER NOT NULL,
    disk_mb        INTEGER NOT NULL,
    free_memory_mb INTEGER NOT NULL,
    free_cpus      REAL NOT NULL,
    free_disk_mb   INTEGER NOT NULL,
    live_cells     INTEGER NOT NULL,
    labels         TEXT NOT NULL,  -- JSON
    state          TEXT NOT NULL,
    registered_at  REAL NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS audit_records (  -- the audit trail (SPEC §20), since version 7
    writer     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    at         REAL NOT NULL,
    principal  TEXT NOT NULL,
    key_name   TEXT NOT NULL,
    action     TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    status     INTEGER NOT NULL,
    touched    TEXT NOT NULL,  -- JSON
    prev       TEXT NOT NULL,
    hash       TEXT NOT NULL,
    PRIMARY KEY (writer, seq)
) STRICT;
CREATE INDEX IF NOT EXISTS audit_by_time ON audit_records (at, writer, seq);
CREATE INDEX IF NOT EXISTS audit_by_sandbox ON audit_records (sandbox_id, at, writer, seq);
CREATE INDEX IF NOT EXISTS audit_by_principal ON audit_records (principal, at, writer, seq);
CREATE TABLE IF NOT EXISTS audit_heads (  -- where each writer's chain stands (7)
    writer      TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL,
    hash        TEXT NOT NULL,
    anchor_seq  INTEGER NOT NULL,
    anchor_prev TEXT NOT NULL
) STRICT;
"""

# Column lists come from the record classes (never from input), hence the S608 waivers below.
_SBX_COLS = ", ".join(SandboxRecord.fields())
_KEY_COLS = ", ".join(ApiKeyRecord.fields())
_UPSERT_SANDBOX = (
    f"INSERT INTO sandboxes ({_SBX_COLS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + c for c in SandboxRecord.fields())}) "
    "ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in SandboxRecord.fields()[1:])
)
_PARKED = ", ".join("?" * len(PARKED_STATES))
# The workspaces an owner keeps without a cell (SandboxRecord.keeps_workspace), in SQL.
_KEEPS_WORKSPACE = (
    f"(state IN ({', '.join(repr(s) for s in PAUSED_STATES)})"
    " OR (state = 'snapshotting' AND paused_at > 0))"
)
_COUNT_KEPT = f"SELECT COUNT(*) FROM sandboxes WHERE owner = ? AND id != ? AND {_KEEPS_WORKSPACE}"  # noqa: S608
# Bytes an owner's quota counts: its snapshots and its copies in flight (but `token`'s own).
_SNAPSHOT_BYTES_HELD = (
    "SELECT (SELECT COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE owner = :owner)"
    " + (SELECT COALESCE(SUM(size), 0) FROM snapshot_reservations"
    " WHERE owner = :owner AND until > :now AND token != :token)"
)
_SET_ALL = ", ".join(f"{c} = :{c}" for c in SandboxRecord.fields()[1:])
_SNAP_COLS = ", ".join(SnapshotRecord.fields())
_INSERT_SNAPSHOT = (
    f"INSERT INTO snapshots ({_SNAP_COLS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + c for c in SnapshotRecord.fields())})"
)
_USECRET_COLS = ", ".join(UserSecretRecord.fields())
_INSERT_USECRET = (
    f"INSERT INTO user_secrets ({_USECRET_COLS}, {USER_SECRET_VALUE_FIELD}) "  # noqa: S608
    f"VALUES ({', '.join(':' + c for c in UserSecretRecord.fields())}, :blob)"
)
_NODE_COLS = ", ".join(NodeRecord.fields())
# A heartbeat rewrites the figures; a known node keeps its state and first registration.
_UPSERT_NODE = (
    f"INSERT INTO nodes ({_NODE_COLS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + c for c in NodeRecord.fields())}) "
    "ON CONFLICT (name) DO UPDATE SET "
    + ", ".join(
        f"{c} = excluded.{c}"
        for c in NodeRecord.fields()
        if c not in ("name", "state", "registered_at")
    )
    + f" RETURNING {_NODE_COLS}"
)
_AUDIT_COLS = ", ".join(AUDIT_FIELDS)
_INSERT_AUDIT = (
    f"INSERT INTO audit_records ({_AUDIT_COLS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + c for c in AUDIT_FIELDS)})"
)
_INSERT_KEY = (
    f"INSERT INTO api_keys ({_KEY_COLS}) "  # noqa: S608
    f"VALUES ({', '.join(':' + c for c in ApiKeyRecord.fields())})"
)


def _create_private(path: Path) -> None:
    """Create the file 0600 before SQLite opens it; SQLite gives -wal/-shm the same mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switches a file to WAL (it stays so). Switching takes an exclusive lock without
    calling the busy handler, so processes opening a fresh file at once can get "database is
    locked" at once (measured: 1 in ~1,000 of 16 concurrent opens): retried up to the same
    bound as `busy_timeout`."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"store schema version {version} is newer than this sandcell supports "
            f"({SCHEMA_VERSION}); upgrade sandcell"
        )
    if version < SCHEMA_VERSION:
        # IMMEDIATE: processes opening a fresh or old file together serialise here.
        conn.execute("BEGIN IMMEDIATE")
        try:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(sandboxes)")}
            for name, decl in _ADDED_COLUMNS.items():
                if columns and name not in columns:
                    conn.execute(f"ALTER TABLE sandboxes ADD COLUMN {name} {decl}")
            for statement in _SCHEMA.split(";\n"):  # IF NOT EXISTS: new tables and indexes
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


class SQLiteStore(Store):
    def __init__(self, path: Path, sealer: Sealer) -> None:
        super().__init__(sealer)
        _create_private(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _use_wal(self._conn)
            self._conn.execute("PRAGMA synchronous = NORMAL")  # durable enough with WAL, faster
            _migrate(self._conn)
        except BaseException:
            self._conn.close()
            raise

    def _write(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        """Run one autocommitted statement; return the number of rows it changed."""
        with self._lock:
            return self._conn.execute(sql, params).rowcount

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """Several statements as one: BEGIN IMMEDIATE takes the write lock up front, so what
        the transaction reads stays true until it commits, for other processes too."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- sandboxes ---------------------------------------------------------------------------

    async def put_sandbox(self, rec: SandboxRecord, reservation: Reservation | None = None) -> None:
        if reservation is None:
            self._write(_UPSERT_SANDBOX, rec.to_flat())
            return
        with self._transaction() as conn:
            conn.execute(_UPSERT_SANDBOX, rec.to_flat())
            conn.execute("DELETE FROM reservations WHERE token = ?", (reservation.token,))

    async def reserve_sandbox(self, owner: str, limit: int) -> Reservation | None:
        reservation = Reservation.new(owner)
        now = time.time()
        with self._transaction() as conn:
            conn.execute("DELETE FROM reservations WHERE until <= ?", (now,))
            # Like Redis's quota set: a sandbox past its lifetime is the reaper's, not a slot.
            held = conn.execute(
                "SELECT (SELECT COUNT(*) FROM sandboxes WHERE owner = ? AND expires_at > ?"  # noqa: S608
                f" AND state NOT IN ({_PARKED}))"
                " + (SELECT COUNT(*) FROM reservations WHERE owner = ?)",
                (owner, now, *PARKED_STATES, owner),
            ).fetchone()[0]
            if held >= limit:
                return None
            conn.execute(
                "INSERT INTO reservations (token, owner, until) VALUES (?, ?, ?)",
                (reservation.token, owner, reservation.until),
            )
        return reservation

    async def release_reservation(self, reservation: Reservation) -> None:
        self._write("DELETE FROM reservations WHERE token = ?", (reservation.token,))

    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        rows = self._read(f"SELECT {_SBX_COLS} FROM sandboxes WHERE id = ?", (sandbox_id,))  # noqa: S608
        return SandboxRecord.from_dict(rows[0]) if rows else None

    async def touch(self, sandbox_id: str, now: float, idle_timeout_s: int | None = None) -> bool:
        fields: dict[str, FieldValue] = {"last_activity_at": now}
        if idle_timeout_s is not None:
            fields["idle_timeout_s"] = idle_timeout_s
        return await self._update_if_exists(sandbox_id, fields)  # `deadline` follows by itself

    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxRecord]:
        where, params = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        rows = self._read(
            f"SELECT {_SBX_COLS} FROM sandboxes {where} ORDER BY created_at, id",  # noqa: S608
            params,
        )
        return [SandboxRecord.from_dict(row) for row in rows]

    async def count_sandboxes(self, owner: str | None = None) -> int:
        where, params = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        return self._read(f"SELECT COUNT(*) FROM sandboxes {where}", params)[0][0]  # noqa: S608

    async def due_for_reaping(self, now: float, limit: int) -> list[str]:
        rows = self._read(
            "SELECT id FROM sandboxes WHERE deadline <= ? ORDER BY deadline LIMIT ?", (now, limit)
        )
        return [row[0] for row in rows]

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        return self._write("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,)) == 1

    async def transition(self, rec: SandboxRecord, expected: Sequence[str]) -> bool:
        marks = ", ".join(f":s{i}" for i in range(len(expected)))
        sql = f"UPDATE sandboxes SET {_SET_ALL} WHERE id = :id AND state IN ({marks})"  # noqa: S608
        params = {**rec.to_flat(), **{f"s{i}": state for i, state in enumerate(expected)}}
        return self._write(sql, params) == 1

    async def start_pause(self, rec: SandboxRecord, limit: int) -> PauseStart:
        with self._transaction() as conn:
            kept = conn.execute(_COUNT_KEPT, (rec.owner, rec.id)).fetchone()[0]
            if kept >= limit:
                return "full"
            sql = f"UPDATE sandboxes SET {_SET_ALL} WHERE id = :id AND state = 'running'"  # noqa: S608
            return "moved" if conn.execute(sql, rec.to_flat()).rowcount == 1 else "lost"

    async def _update_if_exists(self, sandbox_id: str, fields: Mapping[str, FieldValue]) -> bool:
        assignments = ", ".join(f"{name} = ?" for name in fields)  # names are ours, not input
        sql = f"UPDATE sandboxes SET {assignments} WHERE id = ?"  # noqa: S608
        return self._write(sql, (*fields.values(), sandbox_id)) == 1

    async def _get_session_blob(self, sandbox_id: str) -> bytes | None:
        rows = self._read(
            f"SELECT {SESSION_KEY_FIELD} FROM sandboxes WHERE id = ?",  # noqa: S608
            (sandbox_id,),
        )
        return rows[0][0] if rows else None

    # -- snapshots ---------------------------------------------------------------------------

    async def reserve_snapshot_bytes(
        self, owner: str, size: int, quota: int
    ) -> ByteReservation | None:
        return self._hold_bytes(ByteReservation.new(owner, size), quota)

    async def resize_snapshot_reservation(
        self, reservation: ByteReservation, size: int, quota: int
    ) -> ByteReservation | None:
        return self._hold_bytes(reservation.resized(size), quota)

    def _hold_bytes(self, reservation: ByteReservation, quota: int) -> ByteReservation | None:
        """Writes `reservation` (new, or replacing its token's) if it fits under `quota`."""
        now = time.time()
        with self._transaction() as conn:
            conn.execute("DELETE FROM snapshot_reservations WHERE until <= ?", (now,))
            params = {"owner": reservation.owner, "now": now, "token": reservation.token}
            held = conn.execute(_SNAPSHOT_BYTES_HELD, params).fetchone()[0]
            if held + reservation.size > quota:
                return None
            conn.execute(
                "INSERT INTO snapshot_reservations (token, owner, size, until) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (token) DO UPDATE SET size = excluded.size, until = excluded.until",
                (reservation.token, reservation.owner, reservation.size, reservation.until),
            )
        return reservation

    async def release_snapshot_bytes(self, reservation: ByteReservation) -> None:
        self._write("DELETE FROM snapshot_reservations WHERE token = ?", (reservation.token,))

    async def snapshot_bytes_held(self, owner: str) -> int:
        params = {"owner": owner, "now": time.time(), "token": ""}
        with self._lock:
            return self._conn.execute(_SNAPSHOT_BYTES_HELD, params).fetchone()[0]

    async def put_snapshot(
        self, rec: SnapshotRecord, reservation: ByteReservation | None = None
    ) -> None:
        with self._transaction() as conn:
            conn.execute(_INSERT_SNAPSHOT, rec.to_flat())
            if reservation is not None:
                conn.execute(
                    "DELETE FROM snapshot_reservations WHERE token = ?", (reservation.token,)
                )

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        rows = self._read(f"SELECT {_SNAP_COLS} FROM snapshots WHERE id = ?", (snapshot_id,))  # noqa: S608
        return SnapshotRecord.from_dict(rows[0]) if rows else None

    async def list_snapshots(self, owner: str | None = None) -> list[SnapshotRecord]:
        where, params = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        sql = f"SELECT {_SNAP_COLS} FROM snapshots {where} ORDER BY created_at, id"  # noqa: S608
        return [SnapshotRecord.from_dict(row) for row in self._read(sql, params)]

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return self._write("DELETE FROM snapshots WHERE id = ?", (snapshot_id,)) == 1

    # -- API keys -----------------------------------------------------------------------------

    async def put_api_key(self, rec: ApiKeyRecord) -> None:
        try:
            self._write(_INSERT_KEY, rec.to_flat())
        except sqlite3.IntegrityError as e:
            raise ApiKeyExistsError(f"an API key named {rec.name!r} already exists") from e

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKeyRecord | None:
        rows = self._read(f"SELECT {_KEY_COLS} FROM api_keys WHERE key_hash = ?", (key_hash,))  # noqa: S608
        return ApiKeyRecord.from_dict(rows[0]) if rows else None

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        rows = self._read(f"SELECT {_KEY_COLS} FROM api_keys ORDER BY name")  # noqa: S608
        return [ApiKeyRecord.from_dict(row) for row in rows]

    async def revoke_api_key(self, name: str) -> bool:
        return self._write("UPDATE api_keys SET revoked = 1 WHERE name = ?", (name,)) == 1

    # -- manager secrets ----------------------------------------------------------------------

    async def _get_secret_blob(self, name: str) -> bytes | None:
        rows = self._read("SELECT value FROM secrets WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    async def _put_secret_blob_if_absent(self, name: str, blob: bytes) -> bytes:
        # A stored secret is never overwritten, so the SELECT sees whichever INSERT came first.
        self._write(
            "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (name, blob),
        )
        return self._read("SELECT value FROM secrets WHERE name = ?", (name,))[0][0]

    # -- principals' secrets ------------------------------------------------------------------

    async def _put_user_secret_blob(
        self, rec: UserSecretRecord, blob: bytes, limit: int
    ) -> SecretPut:
        with self._transaction() as conn:
            held = conn.execute(
                "SELECT COUNT(*) FROM user_secrets WHERE owner = ?", (rec.owner,)
            ).fetchone()[0]
            taken = conn.execute(
                "SELECT 1 FROM user_secrets WHERE owner = ? AND name = ?", (rec.owner, rec.name)
            ).fetchone()
            if taken:
                return "exists"
            if held >= limit:
                return "full"
            conn.execute(_INSERT_USECRET, {**rec.to_flat(), "blob": blob})
        return "created"

    async def _update_user_secret(self, rec: UserSecretRecord, blob: bytes | None) -> bool:
        sets = "hosts = :hosts, places = :places, updated_at = :updated_at"
        if blob is not None:
            sets += f", {USER_SECRET_VALUE_FIELD} = :blob"
        sql = f"UPDATE user_secrets SET {sets} WHERE owner = :owner AND name = :name"  # noqa: S608
        return self._write(sql, {**rec.to_flat(), "blob": blob}) == 1

    async def _get_user_secret_blob(self, owner: str, name: str) -> bytes | None:
        rows = self._read(
            f"SELECT {USER_SECRET_VALUE_FIELD} FROM user_secrets WHERE owner = ? AND name = ?",  # noqa: S608
            (owner, name),
        )
        return rows[0][0] if rows else None

    async def get_user_secret(self, owner: str, name: str) -> UserSecretRecord | None:
        rows = self._read(
            f"SELECT {_USECRET_COLS} FROM user_secrets WHERE owner = ? AND name = ?",  # noqa: S608
            (owner, name),
        )
        return UserSecretRecord.from_dict(rows[0]) if rows else None

    async def list_user_secrets(self, owner: str) -> list[UserSecretRecord]:
        rows = self._read(
            f"SELECT {_USECRET_COLS} FROM user_secrets WHERE owner = ? ORDER BY name",  # noqa: S608
            (owner,),
        )
        return [UserSecretRecord.from_dict(row) for row in rows]

    async def delete_user_secret(self, owner: str, name: str) -> bool:
        sql = "DELETE FROM user_secrets WHERE owner = ? AND name = ?"
        return self._write(sql, (owner, name)) == 1

    # -- the node roster ----------------------------------------------------------------------

    async def _put_node(self, rec: NodeRecord) -> NodeRecord:
        with self._lock:
            # fetchall: a RETURNING statement commits only once stepped to its end
            row = self._conn.execute(_UPSERT_NODE, rec.to_flat()).fetchall()[0]
        return NodeRecord.from_dict(row)

    async def _set_node_state(self, name: str, state: NodeState) -> bool:
        return self._write("UPDATE nodes SET state = ? WHERE name = ?", (state, name)) == 1

    async def get_node(self, name: str) -> NodeRecord | None:
        rows = self._read(f"SELECT {_NODE_COLS} FROM nodes WHERE name = ?", (name,))  # noqa: S608
        return NodeRecord.from_dict(rows[0]) if rows else None

    async def list_nodes(self) -> list[NodeRecord]:
        rows = self._read(f"SELECT {_NODE_COLS} FROM nodes ORDER BY name")  # noqa: S608
        return [NodeRecord.from_dict(row) for row in rows]

    async def remove_node(self, name: str) -> bool:
        return self._write("DELETE FROM nodes WHERE name = ?", (name,)) == 1

    # -- the audit trail ----------------------------------------------------------------------

    async def append_audits(self, records: Sequence[AuditRecord]) -> None:
        if not records:
            return
        writer = records[0].writer
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT seq, hash FROM audit_heads WHERE writer = ?", (writer,)
            ).fetchone()
            seq, head = (row[0], row[1]) if row else (0, GENESIS)
            for rec in records:
                if (rec.writer, rec.seq, rec.prev) != (writer, seq + 1, head):
                    raise AuditConflictError(
                        f"audit writer {rec.writer!r} is at seq {seq}: seq {rec.seq} does not"
                        " follow it (another process writes under this writer id?)"
                    )
                seq, head = rec.seq, rec.hash
            conn.executemany(_INSERT_AUDIT, [rec.to_flat() for rec in records])
            conn.execute(
                "INSERT INTO audit_heads (writer, seq, hash, anchor_seq, anchor_prev)"
                " VALUES (?, ?, ?, 1, ?) ON CONFLICT (writer) DO UPDATE"
                " SET seq = excluded.seq, hash = excluded.hash",
                (writer, seq, head, GENESIS),
            )

    async def audit_head(self, writer: str) -> AuditHead | None:
        rows = self._read(
            "SELECT writer, seq, hash, anchor_seq, anchor_prev FROM audit_heads WHERE writer = ?",
            (writer,),
        )
        return AuditHead(*rows[0]) if rows else None

    async def audit_writers(self) -> list[str]:
        # Records' writers too: a head deleted behind the store's back still leaves its chain.
        sql = "SELECT writer FROM audit_heads UNION SELECT writer FROM audit_records ORDER BY 1"
        return [row[0] for row in self._read(sql)]

    async def audit_chain(
        self, writer: str, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, AuditRecord | None]]:
        rows = self._read(
            f"SELECT {_AUDIT_COLS} FROM audit_records WHERE writer = ? AND seq > ?"  # noqa: S608
            " ORDER BY seq LIMIT ?",
            (writer, after, limit),
        )
        return [(row["seq"], _audit_record(row)) for row in rows]

    async def list_audit(self, query: AuditQuery) -> AuditPage:
        where, params = ["1"], list[Any]()
        for column, value in (
            ("sandbox_id", query.sandbox_id),
            ("action", query.action),
            ("principal", query.principal),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if query.since is not None:
            where.append("at >= ?")
            params.append(query.since)
        if query.until is not None:
            where.append("at < ?")
            params.append(query.until)
        if query.after is not None:
            where.append("(at, writer, seq) > (?, ?, ?)")
            params.extend(parse_cursor(query.after))
        rows = self._read(
            f"SELECT {_AUDIT_COLS} FROM audit_records WHERE {' AND '.join(where)}"  # noqa: S608
            " ORDER BY at, writer, seq LIMIT ?",
            (*params, query.limit + 1),
        )
        return page_of([r for r in map(_audit_record, rows) if r is not None], query.limit)

    async def prune_audit(self, writer: str, keep_from: int) -> int:
        with self._transaction() as conn:
            head = conn.execute(
                "SELECT seq, hash, anchor_seq FROM audit_heads WHERE writer = ?", (writer,)
            ).fetchone()
            if head is None or keep_from <= head["anchor_seq"]:
                return 0
            keep_from = min(keep_from, head["seq"] + 1)
            last = conn.execute(
                "SELECT hash FROM audit_records WHERE writer = ? AND seq = ?",
                (writer, keep_from - 1),
            ).fetchone()
            if keep_from > head["seq"]:
                anchor_prev = head["hash"]
            elif last is not None:
                anchor_prev = last[0]
            else:
                raise AuditConflictError(
                    f"audit writer {writer!r} has no record {keep_from - 1} to anchor on"
                )
            conn.execute(
                "UPDATE audit_heads SET anchor_seq = ?, anchor_prev = ? WHERE writer = ?",
                (keep_from, anchor_prev, writer),
            )
            return conn.execute(
                "DELETE FROM audit_records WHERE writer = ? AND seq < ?", (writer, keep_from)
            ).rowcount

    # -- lifecycle ----------------------------------------------------------------------------

    async def ping(self) -> None:
        self._read("SELECT 1")

    async def close(self) -> None:
        with self._lock:
            self._conn.close()


def _audit_record(row: sqlite3.Row) -> AuditRecord | None:
    """A stored row as a record, or None if an edit left it no longer one."""
    try:
        return AuditRecord.from_flat(row)
    except (ValueError, TypeError, KeyError):
        return None
