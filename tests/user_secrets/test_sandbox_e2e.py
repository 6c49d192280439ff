"""Sandboxes created with secrets (SPEC §17), in real cells: a placeholder per secret in
every command's environment, unique per sandbox, the secrets' hosts in the sandbox's policy,
and `bindings_from_store` giving the proxy the current value (rotated, or gone)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from sandcell import Sandbox
from sandcell.client import ClientConfig
from sandcell.client.errors import ForbiddenError, NotFoundError
from sandcell.secrets.lookup import bindings_from_store
from sandcell.store import Sealer, load_store_key, open_store
from sdk.helpers import stop_and_clean
from support.server import RunningServer, start_server
from user_secrets.helpers import CONFIG

pytestmark = pytest.mark.slow

VALUE = "ghp_0a1b2c3d4e5f-real-token-value"
PLACEHOLDER = re.compile(r"^sandcell-secret-GH_TOKEN-[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def config(server: RunningServer) -> Iterator[ClientConfig]:
    key = server.create_key("alice")
    with server.client(key) as c:
        body = {"name": "GH_TOKEN", "value": VALUE, "hosts": ["api.github.com"]}
        assert c.post("/v1/secrets", json=body).status_code == 201
        yield ClientConfig(url=server.url, api_key=key)
        for sbx in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sbx['id']}")


def _bindings(server: RunningServer, sandbox_id: str) -> tuple:
    async def look() -> tuple:
        sealer = Sealer(load_store_key(server.data_dir))
        async with open_store(f"sqlite://{server.data_dir / 'sandcell.db'}", sealer) as store:
            return await bindings_from_store(store)(sandbox_id)

    return asyncio.run(look())


def test_placeholders_in_env_policy_and_bindings(server: RunningServer, config: ClientConfig):
    with (
        Sandbox.create(config=config, template="listed", secrets=["GH_TOKEN"]) as one,
        Sandbox.create(config=config, template="listed", secrets=["GH_TOKEN"]) as two,
    ):
        seen = []
        for sbx in (one, two):
            env = sbx.commands.run("env", timeout=20).stdout
            assert VALUE not in env
            lines = [line for line in env.splitlines() if line.startswith("GH_TOKEN=")]
            assert len(lines) == 1, env
            placeholder = lines[0].removeprefix("GH_TOKEN=")
            assert PLACEHOLDER.match(placeholder), placeholder
            seen.append(placeholder)
            # A command's own env does not hide it, and a later command sees the same one.
            again = sbx.commands.run("printenv GH_TOKEN", timeout=20).stdout.strip()
            assert again == placeholder
        assert seen[0] != seen[1]  # unique per sandbox

        with httpx.Client(base_url=server.url) as c:
            c.headers["authorization"] = f"Bearer {config.api_key}"
            network = c.get(f"/v1/sandboxes/{one.id}").json()["network"]
        assert network["egress"] == "allowlist"
        assert network["allow"] == ["pypi.org", "api.github.com"]  # the template's, then its

        (binding,) = _bindings(server, one.id)
        assert binding.name == "GH_TOKEN" and binding.placeholder == seen[0]
        assert binding.value == VALUE.encode() and binding.hosts == {"api.github.com"}
        assert binding.where == {"headers"} and VALUE not in repr(binding)
        assert _bindings(server, two.id)[0].placeholder == seen[1]
        assert _bindings(server, "sbx-no-such-sandbox") == ()

        with httpx.Client(base_url=server.url) as c:
            c.headers["authorization"] = f"Bearer {config.api_key}"
            rotated = {"value": VALUE + "-v2", "hosts": ["api.github.com", "uploads.github.com"]}
            assert c.put("/v1/secrets/GH_TOKEN", json=rotated).status_code == 200
            (binding,) = _bindings(server, one.id)
            assert binding.value == (VALUE + "-v2").encode()
            assert binding.hosts == {"api.github.com", "uploads.github.com"}
            assert c.delete("/v1/secrets/GH_TOKEN").status_code == 204
            assert _bindings(server, one.id) == ()  # the proxy refuses its placeholder now
            body = {"name": "GH_TOKEN", "value": VALUE, "hosts": ["api.github.com"]}
            assert c.post("/v1/secrets", json=body).status_code == 201
    assert VALUE not in server.log.read_text()


def test_refusals_through_the_sdk(config: ClientConfig) -> None:
    with pytest.raises(NotFoundError, match="NOT_THERE"):
        Sandbox.create(config=config, secrets=["NOT_THERE"])
    with pytest.raises(ForbiddenError, match="network_max"):
        Sandbox.create(config=config, template="closed", secrets=["GH_TOKEN"])


def test_a_fork_gets_placeholders_of_its_own(server: RunningServer, config: ClientConfig):
    with Sandbox.create(config=config, secrets=["GH_TOKEN"], env={"KEEP": "1"}) as parent:
        theirs = parent.commands.run("printenv GH_TOKEN").stdout.strip()
        with parent.fork() as child:
            mine = child.commands.run("printenv GH_TOKEN KEEP").stdout.split()
            assert PLACEHOLDER.match(mine[0]) and mine[0] != theirs and mine[1] == "1"
            (binding,) = _bindings(server, child.id)
            assert binding.placeholder == mine[0] and binding.value == VALUE.encode()
            assert _bindings(server, parent.id)[0].placeholder == theirs


def test_placeholders_survive_a_restart(tmp_path) -> None:
    data = tmp_path / "data"
    first = start_server(data, config_text=CONFIG)
    try:
        key = first.create_key("carol")
        with first.client(key) as c:
            body = {"name": "GH_TOKEN", "value": VALUE, "hosts": ["api.github.com"]}
            assert c.post("/v1/secrets", json=body).status_code == 201
            sandbox_id = c.post("/v1/sandboxes", json={"secrets": ["GH_TOKEN"]}).json()["id"]
        before = _bindings(first, sandbox_id)
    finally:
        first.stop()  # the sandbox keeps running, for the next start to adopt
    second = start_server(data, config_text=CONFIG)
    try:
        with second.client(key) as c:
            run = {"command": "printenv GH_TOKEN", "timeout_s": 20}
            r = c.post(f"/v1/sandboxes/{sandbox_id}/exec", json=run)
            assert r.status_code == 200, r.text
            assert r.json()["stdout"].strip() == before[0].placeholder
            assert _bindings(second, sandbox_id) == before
            c.delete(f"/v1/sandboxes/{sandbox_id}")
    finally:
        stop_and_clean(second)  # and the warm cells that both servers' pool kept
