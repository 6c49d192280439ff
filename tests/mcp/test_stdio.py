"""`sandcell mcp` over stdio, driven by the official MCP client that spawns it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from sandcell.mcp.session import RECHECK_AFTER_S
from support.mcp_client import (
    call,
    check_tool_list,
    exercise_named_sandboxes,
    exercise_session_sandbox,
    session_sandboxes,
    text,
    wait_gone,
)
from support.server import RunningServer, sandcell_bin

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_tools_over_stdio(server: RunningServer, api_key: str, env: dict[str, str]):
    params = StdioServerParameters(command=sandcell_bin(), args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await check_tool_list(session)
        await exercise_session_sandbox(session)
        await exercise_named_sandboxes(session)
        assert len(session_sandboxes(server, api_key)) == 1
    wait_gone(server, api_key)
    with server.client(api_key) as http:  # SPEC §20: the tools' actions, under the MCP's key
        trail = http.get("/v1/audit").json()["records"]
    assert {"sandbox.create", "exec", "file.write", "sandbox.delete"} <= {
        r["action"] for r in trail
    }
    assert {r["key_name"] for r in trail if r["action"] == "exec"} == {"mcp-test_tools_over_stdio"}


async def test_an_expired_session_sandbox_is_replaced(
    server: RunningServer, api_key: str, env: dict[str, str]
):
    params = StdioServerParameters(command=sandcell_bin(), args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await call(session, "write_file", path="a.txt", content="x")
        (first,) = session_sandboxes(server, api_key)
        with server.client(api_key) as http:  # as its idle timeout would
            http.delete(f"/v1/sandboxes/{first}").raise_for_status()
        await anyio.sleep(RECHECK_AFTER_S)  # a pause: the next call checks the sandbox first
        fresh = await call(session, "run_command", command="ls")
        assert not fresh.is_error and "a.txt" not in text(fresh)
        (second,) = session_sandboxes(server, api_key)
        assert second != first
    wait_gone(server, api_key)


CLIENT = """
import anyio, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("run_command", {"command": "true"})
        assert not result.is_error, result
        print("ready", flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def test_killed_client_leaves_no_sandbox(server: RunningServer, api_key: str, env):
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CLIENT), sandcell_bin()],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout.readline().strip() == "ready"
        assert len(session_sandboxes(server, api_key)) == 1
        client.send_signal(signal.SIGKILL)  # no goodbye: the server only sees its stdin close
        client.wait(10)
        started = time.monotonic()
        wait_gone(server, api_key)
        assert time.monotonic() - started < 30
    finally:
        client.kill()
        client.wait()
