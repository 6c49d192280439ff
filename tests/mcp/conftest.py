"""A real `sandcell serve` for the MCP tests, and what a client needs to start `sandcell mcp`."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sdk.helpers import served
from support.server import RunningServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("mcp"), warm_pool=1)


@pytest.fixture
def api_key(server: RunningServer, request: pytest.FixtureRequest) -> str:
    """A key per test: its sandboxes are the test's own to count."""
    return server.create_key(f"mcp-{request.node.name}"[:60])


@pytest.fixture
def env(server: RunningServer, api_key: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SANDCELL_URL": server.url,
        "SANDCELL_API_KEY": api_key,
    }
