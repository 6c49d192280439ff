"""A real `sandcell serve` and the unmodified e2b SDK pointed at its /e2b façade."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

from sdk.helpers import stop_and_clean
from support.server import RunningServer, start_server


@pytest.fixture(scope="package")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("e2b") / "data", warm_pool=1)
    try:
        yield server
    finally:
        stop_and_clean(server)


@pytest.fixture(scope="package")
def e2b_env(e2b_server: RunningServer) -> dict[str, str]:
    """The three variables of docs/e2b.md."""
    url = f"{e2b_server.url}/e2b"
    return {
        "E2B_API_URL": url,
        "E2B_SANDBOX_URL": url,
        "E2B_API_KEY": e2b_server.create_key("e2b-user"),
    }


@pytest.fixture(scope="package")
def e2b_native_env(e2b_server: RunningServer, e2b_env: dict[str, str]) -> dict[str, str]:
    """`e2b_env` with a key in E2B's own shape (`sandcell keys create NAME --e2b`), for the
    releases that refuse any other (e2b 2.2x-2.4x)."""
    return {**e2b_env, "E2B_API_KEY": e2b_server.create_key("e2b-native", e2b=True)}


@pytest.fixture(scope="package", autouse=True)
def _e2b_environment(e2b_env: dict[str, str]) -> Iterator[None]:
    """Set for these tests only, as a user would export them, so module fixtures see them."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in e2b_env.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def sbx(_e2b_environment: None) -> Iterator[Sandbox]:
    """One sandbox per test module, made and killed through the e2b SDK."""
    sandbox = Sandbox.create(timeout=300)
    yield sandbox
    sandbox.kill()
