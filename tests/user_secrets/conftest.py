"""A real `sandcell serve` per test module, with the templates of `helpers.CONFIG`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.server import RunningServer, start_server
from user_secrets.helpers import CONFIG


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("secrets") / "data", config_text=CONFIG)
    yield srv
    srv.stop()
