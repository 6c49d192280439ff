"""The user side of secrets (SPEC §17): `sandcell secrets set|ls|rm` (the value from stdin or
a file, never argv), the SDK's `Secrets`, `sandcell create --secret`, and MCP's
`create_sandbox(secrets=)`, each against a real `sandcell serve`."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from sandcell import Sandbox
from sandcell.client import ClientConfig
from sandcell.client.secrets import AsyncSecrets, Secrets
from support.mcp_client import call, text
from support.server import RunningServer, sandcell_bin

pytestmark = pytest.mark.slow

VALUE = "xoxb-1234-cli-secret-value-never-in-argv"


@pytest.fixture(scope="module")
def key(server: RunningServer) -> Iterator[str]:
    key = server.create_key("alice")
    yield key
    with server.client(key) as c:
        for sbx in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sbx['id']}")


def cli(
    server: RunningServer, key: str, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess:
    env = {**os.environ, "SANDCELL_URL": server.url, "SANDCELL_API_KEY": key}
    return subprocess.run(
        [sandcell_bin(), *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def test_cli_set_ls_rm(server: RunningServer, key: str, tmp_path: Path) -> None:
    done = cli(
        server, key, "secrets", "set", "SLACK_TOKEN", "--host", "slack.com", stdin=VALUE + "\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SLACK_TOKEN", "slack.com"]
    listed = cli(server, key, "secrets", "ls", "--json")
    (only,) = json.loads(listed.stdout)
    assert only["name"] == "SLACK_TOKEN" and only["in"] == ["headers"]
    assert "SLACK_TOKEN" in cli(server, key, "secrets", "ls").stdout

    # A rotation from a file, with the query opted in; the stored value has no newline.
    path = tmp_path / "token"
    path.write_text(VALUE + "-2\n")
    args = ("secrets", "set", "SLACK_TOKEN", "--host", "slack.com", "--in", "query")
    done = cli(server, key, *args, "--from-file", str(path))
    assert done.returncode == 0, done.stderr
    (only,) = json.loads(cli(server, key, "secrets", "ls", "--json").stdout)
    assert only["in"] == ["headers", "query"]

    refused = cli(
        server, key, "secrets", "set", "SLACK_TOKEN", "--host", "slack.com", "--value", "x"
    )
    assert refused.returncode != 0 and "--value" in refused.stderr  # no such option exists
    empty = cli(server, key, "secrets", "set", "EMPTY", "--host", "slack.com", stdin="\n")
    assert empty.returncode == 1 and "empty" in empty.stderr
    bad = cli(server, key, "secrets", "set", "lower", "--host", "slack.com", stdin=VALUE)
    assert bad.returncode == 1 and "BAD_REQUEST" in bad.stderr and VALUE not in bad.stderr

    made = cli(server, key, "create", "--secret", "SLACK_TOKEN")
    assert made.returncode == 0, made.stderr
    sandbox_id = made.stdout.strip()
    printed = cli(server, key, "exec", sandbox_id, "--", "printenv", "SLACK_TOKEN")
    assert printed.stdout.startswith("sandcell-secret-SLACK_TOKEN-"), printed
    assert VALUE not in printed.stdout
    assert cli(server, key, "rm", sandbox_id).returncode == 0

    assert cli(server, key, "secrets", "rm", "SLACK_TOKEN").returncode == 0
    gone = cli(server, key, "secrets", "rm", "SLACK_TOKEN")
    assert gone.returncode == 1 and "NOT_FOUND" in gone.stderr
    assert json.loads(cli(server, key, "secrets", "ls", "--json").stdout) == []
    assert VALUE not in server.log.read_text()


def test_sdk_secrets(server: RunningServer, key: str) -> None:
    config = ClientConfig(url=server.url, api_key=key)
    made = Secrets.set("SDK_KEY", VALUE, ["api.example.com"], config=config)
    assert made["name"] == "SDK_KEY" and "value" not in made
    rotated = Secrets.set(
        "SDK_KEY", VALUE + "-2", ["api.example.com", "b.example.com"], config=config
    )
    assert rotated["hosts"] == ["api.example.com", "b.example.com"]
    assert [s["name"] for s in Secrets.list(config=config)] == ["SDK_KEY"]
    with Sandbox.create(config=config, secrets=["SDK_KEY"]) as sbx:
        assert "b.example.com" in sbx.last_info.network["allow"]
        assert VALUE not in sbx.commands.run("env").stdout
    assert Secrets.delete("SDK_KEY", config=config)
    assert not Secrets.delete("SDK_KEY", config=config)


@pytest.mark.anyio
async def test_async_sdk_and_mcp(server: RunningServer, key: str) -> None:
    config = ClientConfig(url=server.url, api_key=key)
    await AsyncSecrets.set("MCP_KEY", VALUE, ["api.example.com"], config=config)
    env = {"PATH": os.environ.get("PATH", ""), "SANDCELL_URL": server.url, "SANDCELL_API_KEY": key}
    params = StdioServerParameters(command=sandcell_bin(), args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert "secrets" in tools["create_sandbox"].input_schema["properties"]
        made = await call(session, "create_sandbox", secrets=["MCP_KEY"])
        assert not made.is_error, text(made)
        sandbox_id = json.loads(text(made))["id"]
        printed = await call(
            session, "run_command", command="printenv MCP_KEY", sandbox_id=sandbox_id
        )
        assert "\nsandcell-secret-MCP_KEY-" in text(printed) and VALUE not in text(printed)
        await call(session, "kill_sandbox", sandbox_id=sandbox_id)
        missing = await call(session, "create_sandbox", secrets=["NOT_SET"])
        assert missing.is_error and "NOT_SET" in text(missing)
    assert await AsyncSecrets.delete("MCP_KEY", config=config)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_no_value_in_a_listing_over_http(server: RunningServer, key: str) -> None:
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}) as c:
        assert VALUE not in c.get("/v1/secrets").text
