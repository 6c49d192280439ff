"""E2B's egress options through the unmodified e2b SDK (SPEC §14.2, issue 27 item 1):
`allow_internet_access`, `network.allow_out`/`deny_out` and `update_network` become sandcell's
§11 policy within the template's `network_max`; a wider request, or a field sandcell cannot
honour, is refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import ALL_TRAFFIC, Sandbox
from e2b.exceptions import SandboxException

from sdk.helpers import served
from support.server import SMALL_TEMPLATE, RunningServer

CONFIG = SMALL_TEMPLATE.format(warm_pool=0) + (
    'network = "allowlist"\nnetwork_allow = ["example.com"]\nnetwork_max = "allowlist"\n'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("e2bnet"), config_text=CONFIG)


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.create_key("e2b-net")


def _opts(server: RunningServer, key: str) -> dict[str, Any]:
    url = f"{server.url}/e2b"
    return {"api_key": key, "api_url": url, "sandbox_url": url}


def _policy(server: RunningServer, key: str, sandbox_id: str) -> dict[str, Any]:
    with server.client(key) as c:
        return c.get(f"/v1/sandboxes/{sandbox_id}").raise_for_status().json()["network"]


def test_deny_all_with_allow_out_is_an_allowlist(server: RunningServer, key: str) -> None:
    network = {"deny_out": [ALL_TRAFFIC], "allow_out": ["pypi.org", "203.0.113.0/24"]}
    sbx = Sandbox.create(network=network, **_opts(server, key))
    try:
        policy = _policy(server, key, sbx.sandbox_id)
        assert policy["egress"] == "allowlist"
        assert {"pypi.org", "203.0.113.0/24"} <= set(policy["allow"])
        proxy = sbx.commands.run("echo $HTTPS_PROXY").stdout.strip()
        assert proxy.startswith("http://127.0.0.1:3128")
    finally:
        sbx.kill()


def test_no_internet_is_egress_none_and_absent_is_the_templates(
    server: RunningServer, key: str
) -> None:
    closed = Sandbox.create(allow_internet_access=False, **_opts(server, key))
    default = Sandbox.create(**_opts(server, key))
    try:
        assert _policy(server, key, closed.sandbox_id)["egress"] == "none"
        assert closed.commands.run("echo x${HTTPS_PROXY}x").stdout.strip() == "xx"
        templates = _policy(server, key, default.sandbox_id)
        assert templates["egress"] == "allowlist"
        assert "example.com" in templates["allow"]
    finally:
        closed.kill()
        default.kill()


def test_wider_than_network_max_is_refused_naming_the_setting(
    server: RunningServer, key: str
) -> None:
    with pytest.raises(SandboxException, match="network_max"):
        Sandbox.create(network={"deny_out": ["198.51.100.7"]}, **_opts(server, key))
    with server.client(key) as c:
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []


def test_a_field_sandcell_cannot_honour_is_refused_by_name(server: RunningServer, key: str) -> None:
    with pytest.raises(SandboxException, match="dnsServers"):
        Sandbox.create(network={"dns_servers": ["1.1.1.1"]}, **_opts(server, key))  # type: ignore[typeddict-unknown-key]


def test_allow_public_traffic_is_taken_either_way(server: RunningServer, key: str) -> None:
    # e2b 2.45's model sends E2B's default `allowPublicTraffic: true` with every `network=`.
    for public in (True, False):
        sbx = Sandbox.create(
            network={"allow_public_traffic": public, "deny_out": [ALL_TRAFFIC]},
            **_opts(server, key),
        )
        try:
            assert _policy(server, key, sbx.sandbox_id)["egress"] == "none"
        finally:
            sbx.kill()
    with server.client(key) as c:
        refused = c.post(
            "/e2b/sandboxes",
            headers={"X-API-KEY": key},
            json={"templateID": "base", "network": {"allowPublicTraffic": "yes"}},
        )
    assert refused.status_code == 400
    assert "network.allowPublicTraffic" in refused.json()["message"]


def test_update_network_replaces_the_policy(server: RunningServer, key: str) -> None:
    sbx = Sandbox.create(**_opts(server, key))
    try:
        sbx.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": ["files.example.org"]})
        policy = _policy(server, key, sbx.sandbox_id)
        assert policy["egress"] == "allowlist"
        assert policy["allow"] == ["files.example.org"]
        sbx.update_network({"allow_internet_access": False})
        assert _policy(server, key, sbx.sandbox_id)["egress"] == "none"
        with pytest.raises(SandboxException, match="network_max"):
            sbx.update_network({"deny_out": ["198.51.100.7"]})
    finally:
        sbx.kill()
