"""A real `sandcell serve` per CLI test module, and the environment a user's shell gives
the `sandcell` command (SANDCELL_URL, SANDCELL_API_KEY)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdk.helpers import served
from support.server import RunningServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("cli"), warm_pool=2)


@pytest.fixture(scope="module")
def env(server: RunningServer) -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SANDCELL_URL": server.url,
        "SANDCELL_API_KEY": server.create_key("cli"),
        "COLUMNS": "200",
    }
