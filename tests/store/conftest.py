"""Store fixtures: raw access to what each backend really stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Raw, RedisRaw, SQLiteRaw


@pytest.fixture
def raw(store_url: str) -> Iterator[Raw]:
    if store_url.startswith("sqlite:"):
        yield SQLiteRaw(Path(store_url.removeprefix("sqlite://")))
        return
    backend = RedisRaw(store_url)
    yield backend
    backend.client.close()
