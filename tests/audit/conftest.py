"""Audit fixtures: a tamperer with raw access to what each backend stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .tamper import RedisTamper, SQLiteTamper, Tamper


@pytest.fixture
def tamper(store_url: str) -> Iterator[Tamper]:
    backend: Tamper
    if store_url.startswith("sqlite:"):
        backend = SQLiteTamper(Path(store_url.removeprefix("sqlite://")))
    else:
        backend = RedisTamper(store_url)
    yield backend
    backend.close()
