"""Daemon fixtures: a real daemon process per test or per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.cellapi.client import DaemonClient
from support.daemons import RunningDaemon, launch_daemon


@pytest.fixture
def fresh_daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    """An uninitialised daemon of its own."""
    daemon = launch_daemon(tmp_path)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """An initialised daemon shared by a module; tests work in their own sub-directories."""
    d = launch_daemon(tmp_path_factory.mktemp("daemon"))
    d.initialize(env={"SANDBOX_DEFAULT": "from-template", "OVERRIDE_ME": "default"})
    yield d
    d.stop()


@pytest.fixture
def client(daemon: RunningDaemon) -> Iterator[DaemonClient]:
    with daemon.client() as c:
        yield c
