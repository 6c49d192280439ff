"""A real `sandcell serve` for the SDK tests, and one way to write each test for both clients.

Tests are written once as async functions taking `flavour`: `await flavour(x)` awaits `x` when
the async client returned a coroutine and passes the sync client's plain value through, so the
same body exercises `Sandbox` and `AsyncSandbox`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandcell.client import AsyncSandbox, ClientConfig, Sandbox
from sdk.helpers import Flavour, served
from support.server import RunningServer


@pytest.fixture(scope="session")
def sdk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("sdk"), warm_pool=2)


@pytest.fixture(scope="session")
def api_key(sdk_server: RunningServer) -> str:
    return sdk_server.create_key("sdk-user")


@pytest.fixture(scope="session")
def config(sdk_server: RunningServer, api_key: str) -> ClientConfig:
    return ClientConfig(url=sdk_server.url, api_key=api_key)


@pytest.fixture(scope="module")
def shared_sandbox(config: ClientConfig) -> Iterator[str]:
    """One sandbox for the tests that only need somewhere to work (each connects to it)."""
    with Sandbox.create(config=config) as sbx:
        yield sbx.id


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Flavour:
    return Flavour(request.param, Sandbox if request.param == "sync" else AsyncSandbox)
