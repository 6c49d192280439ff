"""`Sandbox.create(mcp=...)` as on E2B: the API takes `mcp` (E2B's records the servers'
names, nothing more) and the SDK itself starts the gateway in the new sandbox, by
`mcp-gateway --config ...`; where the template has no gateway, as E2B's `base` has none, the
SDK raises "Failed to start MCP gateway" and kills the sandbox. E2B's own
test_mcp_gateway_start_failure_kills_created_sandbox, driven through the unmodified SDK."""

from __future__ import annotations

import uuid

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import SandboxException

from support.server import RunningServer

pytestmark = pytest.mark.slow


def test_a_gateway_that_cannot_start_kills_its_sandbox() -> None:
    metadata = {"mcp_gateway_test": uuid.uuid4().hex}
    with pytest.raises(SandboxException, match=r"Failed to start MCP gateway.*mcp-gateway"):
        Sandbox.create("base", timeout=60, metadata=metadata, mcp={"invalid_server": {}})
    query = SandboxQuery(state=[SandboxState.RUNNING], metadata=metadata)
    assert Sandbox.list(query=query).next_items() == []


def test_mcp_must_be_an_object(e2b_server: RunningServer, e2b_env: dict[str, str]) -> None:
    answer = httpx.post(
        f"{e2b_server.url}/e2b/sandboxes",
        json={"templateID": "base", "mcp": "servers"},
        headers={"X-API-KEY": e2b_env["E2B_API_KEY"]},
        timeout=30,
    )
    assert answer.status_code == 400 and "mcp" in answer.json()["message"], answer.text
