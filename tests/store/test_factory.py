"""open_store: which URLs open which backend, and clear errors for the rest."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandcell.store import Sealer, open_store
from sandcell.store.redis import RedisStore
from sandcell.store.sqlite import SQLiteStore


@pytest.mark.parametrize("slashes", ["///", "////"])
def test_sqlite_absolute_path(tmp_path: Path, sealer: Sealer, slashes: str) -> None:
    db = tmp_path / "nested" / "store.db"
    store = open_store(f"sqlite:{slashes}{str(db).lstrip('/')}", sealer)
    assert isinstance(store, SQLiteStore)
    assert db.is_file()
    asyncio.run(store.close())


def test_sqlite_relative_path(
    tmp_path: Path, sealer: Sealer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    asyncio.run(open_store("sqlite:data/store.db", sealer).close())
    assert (tmp_path / "data" / "store.db").is_file()


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://cache.internal:6380/2", "unix:///run/redis.sock"]
)
def test_redis_urls_connect_lazily(sealer: Sealer, url: str) -> None:
    store = open_store(url, sealer)
    assert isinstance(store, RedisStore)
    asyncio.run(store.close())


@pytest.mark.parametrize(
    "url",
    [
        "",
        "store.db",
        "postgres://admin:hunter2@db/sandcell",
        "sqlite:",
        "sqlite:///",
        "sqlite://somehost/store.db",
        "redis://:hunter2@localhost:notaport/0",
    ],
)
def test_bad_urls_are_clear_value_errors_without_secrets(sealer: Sealer, url: str) -> None:
    with pytest.raises(ValueError, match="expected sqlite:///") as err:
        open_store(url, sealer)
    assert "hunter2" not in str(err.value)
