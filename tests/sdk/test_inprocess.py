"""The SDK's logic against an in-process router stand-in (`httpx.MockTransport`).

Request building, auth headers, retries and error mapping are the SDK's own code: these
tests run it without a network. Real-server behaviour is covered by the other SDK tests.
"""

from __future__ import annotations

import json

import httpx
import pytest

from sandcell import AsyncSandbox, Sandbox
from sandcell.client.config import ClientConfig, RetryPolicy
from sandcell.client.errors import SandboxNotFoundError

SANDBOX = {
    "id": "sbx-inproc",
    "template": "default",
    "state": "running",
    "created_at": "2026-12-01T00:00:00Z",
    "expires_at": "2026-12-01T01:00:00Z",
    "idle_timeout_s": 300,
    "last_activity_at": "2026-12-01T00:00:00Z",
    "metadata": {},
}
RESULT = {
    "exit_code": 0,
    "stdout": "hi\n",
    "stderr": "",
    "stdout_truncated": False,
    "stderr_truncated": False,
    "timed_out": False,
    "signal": None,
    "duration_s": 0.001,
}


class FakeRouter:
    """Answers like the router; `busy` 503s come first to exercise the retry policy."""

    def __init__(self, busy: int = 0) -> None:
        self.busy = busy
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if self.busy:
            self.busy -= 1
            body = {"error": {"code": "OVERLOADED", "message": "busy", "details": {}}}
            return httpx.Response(503, json=body, headers={"Retry-After": "0"})
        route = (request.method, request.url.path)
        if route == ("POST", "/v1/sandboxes"):
            return httpx.Response(201, json=SANDBOX)
        if route == ("POST", "/v1/sandboxes/sbx-inproc/exec"):
            assert json.loads(request.content)["command"] == "echo hi"
            return httpx.Response(200, json=RESULT)
        body = {"error": {"code": "SANDBOX_NOT_FOUND", "message": "no such sandbox"}}
        return httpx.Response(404, json=body)


def _config(router: FakeRouter, **kw: object) -> ClientConfig:
    retry = RetryPolicy(backoff_s=0.001, max_backoff_s=0.001)
    return ClientConfig(url="http://router", api_key="sc_test", retry=retry, **kw)  # type: ignore[arg-type]


def test_sync_sdk_runs_against_an_injected_transport() -> None:
    router = FakeRouter()
    sbx = Sandbox.create(config=_config(router, transport=httpx.MockTransport(router)))
    assert sbx.id == "sbx-inproc"
    assert sbx.commands.run("echo hi").stdout == "hi\n"
    assert all(r.headers["authorization"] == "Bearer sc_test" for r in router.seen)
    with pytest.raises(SandboxNotFoundError):
        Sandbox.connect("sbx-gone", config=_config(router, transport=httpx.MockTransport(router)))


def test_overload_is_retried_for_a_read_but_a_create_is_never_repeated() -> None:
    router = FakeRouter(busy=2)
    transport = httpx.MockTransport(router)
    with pytest.raises(SandboxNotFoundError):
        Sandbox.connect("sbx-gone", config=_config(router, transport=transport))
    assert len(router.seen) == 3  # two 503s, then the answer

    router = FakeRouter(busy=1)
    sbx = Sandbox.create(config=_config(router, transport=httpx.MockTransport(router)))
    # A 503 means the server refused the work, so even a create may go again, once.
    assert sbx.id == "sbx-inproc" and len(router.seen) == 2


@pytest.mark.anyio
async def test_async_sdk_runs_against_an_injected_transport() -> None:
    router = FakeRouter()
    config = _config(router, async_transport=httpx.MockTransport(router))
    sbx = await AsyncSandbox.create(config=config)
    result = await sbx.commands.run("echo hi")
    assert result.exit_code == 0 and result.stdout == "hi\n"
