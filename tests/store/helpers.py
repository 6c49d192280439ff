"""Helpers shared by the store tests (a module, not conftest, so tests can import it)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sandcell.store import SandboxRecord, Sealer, Store, open_store

T = TypeVar("T")
T0 = 1_000_000.0  # a fixed "now" for records, so deadlines are exact numbers in assertions


def make_sandbox(sandbox_id: str, owner: str = "alice", **fields: Any) -> SandboxRecord:
    """A record created at T0 (1 h lifetime, 300 s idle timeout); override any field."""
    values: dict[str, Any] = {
        "template": "default",
        "state": "running",
        "created_at": T0,
        "expires_at": T0 + 3600,
        "idle_timeout_s": 300,
        "last_activity_at": T0,
        "metadata": {"purpose": "test"},
        "env": {"A": "1"},
        "backend": "local",
        "endpoint": {"uds": f"/run/sandcell/{sandbox_id}.sock"},
        "cell": {"pid": 4242, "cgroup": f"sandcell/{sandbox_id}"},
    }
    return SandboxRecord(id=sandbox_id, owner=owner, **(values | fields))


def new_pem() -> bytes:
    """A fresh P-256 private key, PEM, as the manager makes for each session."""
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Raw(Protocol):
    """Access to what a backend really holds, behind the store's back."""

    def session_blob(self, sandbox_id: str) -> bytes | None: ...

    def set_session_blob(self, sandbox_id: str, blob: bytes) -> None: ...

    def dump(self) -> bytes:
        """Every stored byte, as raw as the backend allows."""
        ...


class SQLiteRaw:
    def __init__(self, path: Path) -> None:
        self.path = path

    def session_blob(self, sandbox_id: str) -> bytes | None:
        with sqlite3.connect(self.path) as conn:
            row = conn.execute(
                "SELECT session_key FROM sandboxes WHERE id = ?", (sandbox_id,)
            ).fetchone()
        conn.close()
        return row[0] if row else None

    def set_session_blob(self, sandbox_id: str, blob: bytes) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute("UPDATE sandboxes SET session_key = ? WHERE id = ?", (blob, sandbox_id))
        conn.close()

    def dump(self) -> bytes:
        files = [self.path, self.path.with_name(self.path.name + "-wal")]
        return b"".join(f.read_bytes() for f in files if f.exists())


class RedisRaw:
    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    def session_blob(self, sandbox_id: str) -> bytes | None:
        return self.client.hget(f"sandcell:sbx:{{{sandbox_id}}}", "session_key")

    def set_session_blob(self, sandbox_id: str, blob: bytes) -> None:
        self.client.hset(f"sandcell:sbx:{{{sandbox_id}}}", "session_key", blob)

    def dump(self) -> bytes:
        chunks: list[bytes] = []
        for key in self.client.scan_iter():
            kind = self.client.type(key)
            if kind == b"hash":
                for field, value in self.client.hgetall(key).items():
                    chunks += [field, value]
            elif kind == b"string":
                chunks.append(self.client.get(key))
            elif kind == b"zset":
                chunks += self.client.zrange(key, 0, -1)
        return b"\0".join(chunks)


def race(
    store_url: str, sealer: Sealer, replicas: int, step: Callable[[Store, int], Awaitable[T]]
) -> list[T]:
    """Runs `step` in `replicas` replicas (own thread, loop and connection each) at once."""
    barrier = threading.Barrier(replicas, timeout=10)
    results: list[Any] = [None] * replicas

    async def replica(i: int) -> T:
        async with open_store(store_url, sealer) as store:
            await store.ping()
            barrier.wait()  # blocks this replica's own loop only
            return await step(store, i)

    def run(i: int) -> None:
        try:
            results[i] = asyncio.run(replica(i))
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    return results
