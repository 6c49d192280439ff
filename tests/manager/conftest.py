"""A manager over real cells and a real store (each test runs on SQLite and on Redis)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from sandcell.isolation.cell import LocalCells
from sandcell.manager.backend import LocalBackend
from sandcell.manager.manager import Manager, load_bootstrap_key
from sandcell.manager.templates import Template
from sandcell.store import Store
from support.cells import cleanup_cgroup_parent

SMALL = {"memory_mb": 256, "pids_max": 64, "disk_mb": 64, "warm_pool": 0}


@pytest.fixture
def cgroup_parent() -> str:
    parent = f"sandcell-test-{secrets.token_hex(3)}"
    yield parent
    cleanup_cgroup_parent(parent)


@pytest.fixture
def make_manager(
    store: Store, tmp_path: Path, cgroup_parent: str
) -> Iterator[Callable[..., Awaitable[Manager]]]:
    """Managers over one cells dir; whatever a test leaves (even failing) is destroyed."""

    async def make(**templates: dict) -> Manager:
        specs = templates or {"default": {}}
        built = {name: Template(name=name, **{**SMALL, **spec}) for name, spec in specs.items()}
        backend = LocalBackend(tmp_path / "cells", cgroup_parent=cgroup_parent)
        return Manager(store, backend, built, await load_bootstrap_key(store), reap_interval_s=3600)

    yield make
    LocalCells(tmp_path / "cells", cgroup_parent=cgroup_parent).destroy_all()
