"""`sandcell mcp --http` (streamable HTTP), driven by the official MCP client."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from support.mcp_client import (
    check_tool_list,
    exercise_named_sandboxes,
    exercise_session_sandbox,
    session_sandboxes,
    wait_gone,
)
from support.server import RunningServer, free_port, sandcell_bin

IDLE_TIMEOUT_S = 4
pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def mcp_server(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`sandcell mcp --http` on a free port: its URL and process (stopped with SIGTERM)."""
    port = free_port()
    args = ["mcp", "--http", f"127.0.0.1:{port}", "--idle-timeout", str(IDLE_TIMEOUT_S)]
    proc = subprocess.Popen([sandcell_bin(), *args], env=env)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while not _listening(url):
            assert proc.poll() is None and time.monotonic() < deadline, "sandcell mcp did not start"
            time.sleep(0.1)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _listening(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.TransportError:
        return False
    return True


async def test_tools_over_http(server: RunningServer, api_key: str, mcp_server):
    url, _ = mcp_server
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await check_tool_list(session)
        await exercise_session_sandbox(session)
        await exercise_named_sandboxes(session)
        assert len(session_sandboxes(server, api_key)) == 1
    wait_gone(server, api_key)  # the client's DELETE ended the session; the server runs on


async def test_each_session_has_its_own_sandbox(server: RunningServer, api_key: str, mcp_server):
    url, _ = mcp_server
    async with (
        streamable_http_client(url) as (read_a, write_a),
        ClientSession(read_a, write_a) as a,
        streamable_http_client(url) as (read_b, write_b),
        ClientSession(read_b, write_b) as b,
    ):
        await a.initialize()
        await b.initialize()
        await a.call_tool("write_file", {"path": "mine.txt", "content": "a"})
        seen_by_b = await b.call_tool("list_files", {})
        assert not seen_by_b.is_error and "mine.txt" not in str(seen_by_b.content)
        assert len(session_sandboxes(server, api_key)) == 2
    wait_gone(server, api_key)


CLIENT = """
import anyio, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main():
    async with streamable_http_client(sys.argv[1]) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        assert not (await s.call_tool("run_command", {"command": "true"})).is_error
        print("ready", flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def _killed_client(url: str) -> None:
    """A client that opens a session, uses the session sandbox and dies without a DELETE."""
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CLIENT), url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert client.stdout.readline().strip() == "ready"
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait(10)


def test_idle_timeout_ends_a_killed_clients_session(
    server: RunningServer, api_key: str, mcp_server
):
    url, mcp = mcp_server
    _killed_client(url)
    assert len(session_sandboxes(server, api_key)) == 1
    wait_gone(server, api_key, timeout=IDLE_TIMEOUT_S + 15)
    assert mcp.poll() is None  # the server runs on


def test_server_stop_ends_a_killed_clients_session(server: RunningServer, api_key: str, mcp_server):
    url, mcp = mcp_server
    _killed_client(url)
    assert len(session_sandboxes(server, api_key)) == 1
    mcp.send_signal(signal.SIGTERM)  # the server's lifetime bounds its sessions'
    assert mcp.wait(30) == 0
    assert session_sandboxes(server, api_key) == []  # deleted before the server exited
