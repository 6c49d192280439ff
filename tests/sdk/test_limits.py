"""Overload (503) and rate limiting (429), on a server of their own: brute-forcing keys gets
the client's address refused for a while, which must not disturb the other tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sandcell.client import (
    AsyncSandbox,
    AuthenticationError,
    ClientConfig,
    OverloadedError,
    RateLimitedError,
    RetryPolicy,
    Sandbox,
)
from sdk.helpers import Flavour, stop_and_clean
from support.server import SMALL_TEMPLATE, start_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
NO_RETRY = RetryPolicy(max_retries=0)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientConfig]:
    """A server that takes one request at a time."""
    text = SMALL_TEMPLATE.format(warm_pool=0) + "\n[server]\nmax_inflight = 1\n"
    server = start_server(tmp_path_factory.mktemp("limited") / "data", config_text=text)
    key = server.create_key("limited")
    try:
        yield ClientConfig(url=server.url, api_key=key)
    finally:
        stop_and_clean(server)


async def test_overloaded_then_retried_after_retry_after(flavour: Flavour, limited: ClientConfig):
    with Sandbox.create(config=limited) as sbx:
        busy = threading.Thread(target=sbx.commands.run, args=("sleep 1",))
        busy.start()
        try:
            time.sleep(0.2)  # the exec is in flight: the only slot is taken
            with pytest.raises(OverloadedError) as info:
                await flavour(flavour.cls.list(config=replace(limited, retry=NO_RETRY)))
            assert (info.value.code, info.value.status, info.value.retry_after) == (
                "OVERLOADED",
                503,
                1.0,
            )
            started = time.monotonic()
            listed = await flavour(flavour.cls.list(config=limited))  # waits, then succeeds
            assert time.monotonic() - started >= 0.9
            assert [s.id for s in listed] == [sbx.id]
        finally:
            busy.join()


async def test_rate_limited_after_brute_forcing_api_keys(limited: ClientConfig):
    guessing = replace(limited, api_key="sc_guess", retry=NO_RETRY)
    failures = 0
    with pytest.raises(RateLimitedError) as info:
        for _ in range(30):
            try:
                Sandbox.list(config=guessing)
            except AuthenticationError:
                failures += 1
    assert failures >= 10  # a burst of 10 failures is tolerated, then the address is refused
    assert (info.value.code, info.value.status) == ("RATE_LIMITED", 429)
    assert info.value.retry_after is not None and info.value.retry_after > 0

    # Further failures are refused for both clients, while a valid key is still served...
    with pytest.raises(RateLimitedError):
        await AsyncSandbox.list(config=guessing)
    await AsyncSandbox.list(config=replace(limited, retry=NO_RETRY))
    # ...and a client that retries waits Retry-After (capped) before trying again.
    capped = RetryPolicy(max_retries=1, max_retry_after_s=0.3)
    started = time.monotonic()
    with pytest.raises(RateLimitedError):
        Sandbox.list(config=replace(guessing, retry=capped))
    assert time.monotonic() - started >= 0.3
