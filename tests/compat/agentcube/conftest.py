"""A real `sandcell serve` for the agentcube tests, and the unmodified agentcube client."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from agentcube import CodeInterpreterClient

from sdk.helpers import served
from support.server import RunningServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("agentcube"), warm_pool=1)


@pytest.fixture(scope="module")
def api_key(server: RunningServer) -> str:
    return server.create_key("agentcube-user")


@pytest.fixture
def interpreter(server: RunningServer, api_key: str) -> Callable[..., CodeInterpreterClient]:
    """A `CodeInterpreterClient` pointed at sandcell as an agentcube user would point it."""

    def make(**options: object) -> CodeInterpreterClient:
        settings = {
            "name": "default",
            "namespace": "team-a",
            "workload_manager_url": f"{server.url}/agentcube",
            "router_url": f"{server.url}/agentcube",
            "auth_token": api_key,
            **options,
        }
        return CodeInterpreterClient(**settings)

    return make
