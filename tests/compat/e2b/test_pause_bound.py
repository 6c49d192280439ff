"""The key's bound on paused sandboxes through the unmodified e2b SDK: E2B reads a 409 on
pause as "already paused", so the façade answers the bound as a 429, which the SDK raises
with the bound's name, instead of letting `pause()` quietly return False."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = "[server]\nmax_paused_per_key = 1\n" + SMALL_TEMPLATE.format(warm_pool=0)
    server = start_server(tmp_path_factory.mktemp("paused") / "data", config_text=config)
    try:
        yield server
    finally:
        stop_and_clean(server)


def test_a_pause_past_the_keys_bound_raises(bounded: RunningServer) -> None:
    url = f"{bounded.url}/e2b"
    options = {"api_key": bounded.create_key("pauser"), "api_url": url, "sandbox_url": url}
    first, second = Sandbox.create(**options), Sandbox.create(**options)
    try:
        assert first.pause() is True
        with pytest.raises(RateLimitException, match="max_paused_per_key"):
            second.pause()
        assert second.commands.run("echo still running").stdout == "still running\n"
    finally:
        first.kill()
        second.kill()
