"""Edits of an audit chain behind the store's back: what someone with write access to the
SQLite file or the Redis server could do."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Protocol

import redis

from sandcell.audit.records import FIELDS, AuditRecord


class Tamper(Protocol):
    def edit(self, writer: str, seq: int, **fields: Any) -> None:
        """Change fields of a stored record (its hash left as it was)."""

    def rewrite(self, writer: str, seq: int, **fields: Any) -> None:
        """Change fields and put the matching hash in (a careful forger)."""

    def delete(self, writer: str, seq: int) -> None: ...

    def add(self, rec: AuditRecord) -> None:
        """Store a record at its seq, the head left as it was."""

    def swap(self, writer: str, a: int, b: int) -> None:
        """Exchange two records' places."""

    def close(self) -> None: ...


class SQLiteTamper:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.row_factory = sqlite3.Row

    def _row(self, writer: str, seq: int) -> dict[str, Any]:
        sql = "SELECT * FROM audit_records WHERE writer = ? AND seq = ?"
        return dict(self.conn.execute(sql, (writer, seq)).fetchone())

    def _put(self, writer: str, seq: int, values: dict[str, Any]) -> None:
        values = {k: v for k, v in values.items() if k not in ("writer", "seq")}
        sets = ", ".join(f"{k} = :{k}" for k in values)
        sql = f"UPDATE audit_records SET {sets} WHERE writer = :w AND seq = :s"
        assert self.conn.execute(sql, {**values, "w": writer, "s": seq}).rowcount == 1

    def edit(self, writer: str, seq: int, **fields: Any) -> None:
        self._put(writer, seq, fields)

    def rewrite(self, writer: str, seq: int, **fields: Any) -> None:
        rec = AuditRecord.from_flat({**self._row(writer, seq), **fields}).sealed()
        self._put(writer, seq, rec.to_flat())

    def delete(self, writer: str, seq: int) -> None:
        sql = "DELETE FROM audit_records WHERE writer = ? AND seq = ?"
        assert self.conn.execute(sql, (writer, seq)).rowcount == 1

    def add(self, rec: AuditRecord) -> None:
        values = rec.to_flat()
        marks = ", ".join(":" + k for k in values)
        sql = f"INSERT INTO audit_records ({', '.join(values)}) VALUES ({marks})"
        self.conn.execute(sql, values)

    def swap(self, writer: str, a: int, b: int) -> None:
        first, second = self._row(writer, a), self._row(writer, b)
        self._put(writer, a, second)
        self._put(writer, b, first)

    def close(self) -> None:
        self.conn.close()


class RedisTamper:
    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    @staticmethod
    def _key(writer: str) -> str:
        return f"sandcell:audit:{{{writer}}}:records"

    def _get(self, writer: str, seq: int) -> dict[str, Any]:
        return json.loads(self.client.hget(self._key(writer), str(seq)))

    def edit(self, writer: str, seq: int, **fields: Any) -> None:
        values = {**self._get(writer, seq), **fields}
        self.client.hset(self._key(writer), str(seq), json.dumps(values, sort_keys=True))

    def rewrite(self, writer: str, seq: int, **fields: Any) -> None:
        rec = AuditRecord(**{**self._get(writer, seq), **fields}).sealed()
        self.client.hset(self._key(writer), str(seq), rec.to_json())

    def delete(self, writer: str, seq: int) -> None:
        assert self.client.hdel(self._key(writer), str(seq)) == 1

    def add(self, rec: AuditRecord) -> None:
        self.client.hset(self._key(rec.writer), str(rec.seq), rec.to_json())

    def swap(self, writer: str, a: int, b: int) -> None:
        key = self._key(writer)
        first, second = self.client.hget(key, str(a)), self.client.hget(key, str(b))
        self.client.hset(key, mapping={str(a): second, str(b): first})

    def close(self) -> None:
        self.client.close()


assert "touched" in FIELDS  # the SQLite columns are the record's fields
