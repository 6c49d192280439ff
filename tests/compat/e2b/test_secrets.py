"""E2B's secrets through the façade (SPEC §17, §14.2), driven by the unmodified e2b SDK:
`e2b.Secret` creates, lists, rotates and deletes the principal's own sandcell secrets (the
same store, never a value back); a sandbox created with `envs={NAME: Secret.fill(name)}`
holds only its placeholder, which a real cell's curl gets substituted towards the secret's
host on an HTTPS upstream on loopback (its own CA, `upstream_ca_file`) and refused elsewhere;
what cannot take effect (`network.rules` transforms, `iam` tokens, other metadata) is
refused by name."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, Sandbox, Secret
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    SecretException,
    SecretNotFoundException,
)

from compat.e2b.test_matrix import node_dir  # noqa: F401 - the npm SDK, from its lockfile
from network.tls.conftest import Upstream, UpstreamCA
from sdk.helpers import served
from support.server import OPEN_TEMPLATE, RunningServer

VALUE = "sk-e2b-secret-0123456789abcdef-never-returned"
OTHER = "sk-e2b-other-9876543210-never-returned"
CA = UpstreamCA.make()
CONFIG = '\n[server]\nupstream_ca_file = "{ca}"\n' + OPEN_TEMPLATE + "network_internal = true\n"
LOCAL = {"hosts": "localhost"}
NO_BYPASS = {"NO_PROXY": "", "no_proxy": ""}  # the upstream is on the host's loopback


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    upstream = Upstream(CA.server_context("localhost"))
    yield upstream
    upstream.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("e2bsecrets")
    (root / "upstream-ca.pem").write_bytes(CA.pem())
    yield from served(root, config_text=CONFIG.format(ca=root / "upstream-ca.pem"))


def _opts(server: RunningServer, key: str) -> dict[str, Any]:
    url = f"{server.url}/e2b"
    return {"api_key": key, "api_url": url, "sandbox_url": url}


@pytest.fixture(scope="module")
def alice(server: RunningServer) -> dict[str, Any]:
    return _opts(server, server.create_key("alice"))


@pytest.fixture(scope="module")
def bob(server: RunningServer) -> dict[str, Any]:
    return _opts(server, server.create_key("bob"))


def _raw(server: RunningServer, opts: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=f"{server.url}/e2b", headers={"x-api-key": opts["api_key"]})


def test_create_list_update_delete(server: RunningServer, alice: dict[str, Any]) -> None:
    made = Secret.create("OpenAI-API-Key", VALUE, metadata=LOCAL, **alice)
    assert made.name == "openai_api_key" and made.secret_id.startswith("sec_")
    assert made.version == 1 and made.metadata == LOCAL and not hasattr(made, "value")
    assert made.created_at == made.updated_at
    # By id and by name (E2B's spelling or sandcell's), as E2B selects.
    for selector in (made.secret_id, "openai-api-key", "OPENAI_API_KEY"):
        assert Secret.get_info(selector, **alice).secret_id == made.secret_id
    assert Secret.exists("openai-api-key", **alice)
    for taken in ("openai-api-key", "OPENAI_API_KEY"):  # the same sandcell name: taken
        with pytest.raises(SecretException, match="409: secret openai_api_key exists"):
            Secret.create(taken, OTHER, metadata=LOCAL, **alice)
    # The same secret in sandcell's own API: one store.
    with server.client(alice["api_key"]) as c:
        (listed,) = c.get("/v1/secrets").json()["secrets"]
    assert listed["name"] == "OPENAI_API_KEY" and listed["hosts"] == ["localhost"]

    rotated = Secret.update(made.secret_id, VALUE + "-2", **alice)
    assert rotated.version > made.version and rotated.metadata == LOCAL
    wider = {"hosts": "localhost,api.example.com", "in": "headers,body"}
    again = Secret.update("openai-api-key", VALUE + "-3", metadata=wider, **alice)
    assert again.version > rotated.version and again.metadata == wider
    assert again.secret_id == made.secret_id

    for name in ("key-a", "key-b", "key-c"):
        Secret.create(name, VALUE, metadata=LOCAL, **alice)
    pages = Secret.list(limit=3, **alice)
    first = pages.next_items()
    assert [s.name for s in first] == ["key_a", "key_b", "key_c"] and pages.has_next
    assert [s.name for s in pages.next_items()] == ["openai_api_key"] and not pages.has_next

    with _raw(server, alice) as c:  # no answer carries a value
        answers = [c.get("/secrets"), c.get(f"/secrets/{made.secret_id}")]
    assert all(r.status_code == 200 and "never-returned" not in r.text for r in answers)

    for name in ("key-a", "key-b", "key-c"):
        assert Secret.destroy(name, **alice) is True
    assert Secret.destroy(made.secret_id, **alice) is True
    assert Secret.destroy(made.secret_id, **alice) is False
    assert not Secret.exists("openai-api-key", **alice)
    with pytest.raises(SecretNotFoundException):
        Secret.update("openai-api-key", VALUE, **alice)
    assert "never-returned" not in server.log.read_text()


def test_another_principal_sees_nothing(
    server: RunningServer, alice: dict[str, Any], bob: dict[str, Any]
) -> None:
    made = Secret.create("alices-token", VALUE, metadata=LOCAL, **alice)
    try:
        assert Secret.list(**bob).next_items() == []
        for selector in (made.secret_id, "alices-token"):
            with pytest.raises(SecretNotFoundException):
                Secret.get_info(selector, **bob)
            with pytest.raises(SecretNotFoundException):
                Secret.update(selector, OTHER, **bob)
            assert Secret.destroy(selector, **bob) is False
        # Bob cannot give it to a sandbox either: it is not his.
        with pytest.raises(SandboxException, match="404: secret ALICES_TOKEN not found"):
            Sandbox.create(envs={"ALICES_TOKEN": Secret.fill("alices-token")}, **bob)
        # Bob's own of the same name is another secret.
        his = Secret.create("alices-token", OTHER, metadata=LOCAL, **bob)
        assert his.secret_id != made.secret_id
        assert Secret.destroy(his.secret_id, **alice) is False
        assert Secret.destroy(his.secret_id, **bob) is True
        assert Secret.get_info(made.secret_id, **alice).name == "alices_token"
    finally:
        Secret.destroy(made.secret_id, **alice)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "   ",
        "a b",
        "key.name",
        "ключ",
        "sec_reserved",
        "SEC_x",
        "x" * 129,
        "1password",
        "x" * 65,
    ],
)
def test_bad_names_are_refused(alice: dict[str, Any], name: str) -> None:
    with pytest.raises(SecretException, match=r"^400: ") as info:
        Secret.create(name, VALUE, metadata=LOCAL, **alice)
    assert "name" in str(info.value) and VALUE not in str(info.value)


def test_hostile_bodies_are_refused_by_name(server: RunningServer, alice: dict[str, Any]) -> None:
    refusals = [
        ({"value": VALUE * 2000}, "65536 bytes"),  # over sandcell's largest value
        ({"value": "a\x00" + VALUE}, "NUL"),
        ({"value": ""}, "value"),
        ({"metadata": None}, "metadata.hosts"),
        ({"metadata": {"team": "ml"}}, "metadata.team"),
        ({"metadata": {"hosts": "10.0.0.1"}}, "address"),
        ({"metadata": {"hosts": "*.example.com"}}, "pattern"),
        ({"metadata": {"hosts": "localhost", "in": "query"}}, "headers"),
    ]
    for change, words in refusals:
        args: dict[str, Any] = {"name": "hostile", "value": VALUE, "metadata": LOCAL, **change}
        with pytest.raises(SecretException, match=r"^400: ") as info:
            Secret.create(**args, **alice)
        assert words in str(info.value), (change, info.value)
        assert VALUE not in str(info.value) and "\x00" not in str(info.value)
    with _raw(server, alice) as c:
        huge = c.post("/secrets", json={"name": "huge", "value": "v" * 1_000_000})
        assert huge.status_code == 413 and huge.json()["code"] == 413
        extra = c.post("/secrets", json={"name": "x", "value": "v", "metadata": LOCAL, "ttl": 1})
        assert extra.status_code == 400 and "ttl" in extra.json()["message"]
        assert c.post("/secrets", content=b"[1, 2").status_code == 400
        unknown = c.get("/secrets/sec_00000000000000000000000000000000")
        assert unknown.status_code == 404 and unknown.json() == {
            "code": 404,
            "message": "secret not found",
        }
        assert c.get("/secrets/not%20a%20name").status_code == 400
        assert c.delete("/secrets/sec_nope").status_code == 404
        for env in ([1], "A=1"):  # envVars not an object: a 500 before
            r = c.post("/sandboxes", json={"envVars": env})
            assert r.status_code == 400 and r.json()["message"].startswith("envVars: ")
    with pytest.raises(SecretNotFoundException):
        Secret.get_info("no-such-secret", **alice)
    assert Secret.destroy("no-such-secret", **alice) is False
    assert Secret.list(**alice).next_items() == []  # nothing hostile was stored
    assert "never-returned" not in server.log.read_text()


def test_no_key_or_a_wrong_one(server: RunningServer, alice: dict[str, Any]) -> None:
    with httpx.Client(base_url=f"{server.url}/e2b") as c:
        for method, path in (("GET", "/secrets"), ("POST", "/secrets"), ("GET", "/secrets/a")):
            r = c.request(method, path, json={"name": "a", "value": VALUE, "metadata": LOCAL})
            assert r.status_code == 401 and r.json()["code"] == 401
    with pytest.raises(AuthenticationException):
        Secret.create("a", VALUE, metadata=LOCAL, **{**alice, "api_key": "sc_wrong"})


def test_what_cannot_take_effect_is_refused_by_name(alice: dict[str, Any]) -> None:
    Secret.create("api-token", VALUE, metadata=LOCAL, **alice)
    try:
        header = {"Authorization": f"Bearer {Secret.fill('api-token')}"}
        rules = {"localhost": [{"transform": {"headers": header}}]}
        with pytest.raises(SandboxException, match=r"400: network\.rules: .* adds no headers"):
            Sandbox.create(network={"rules": rules}, **alice)
        iam = {"tokens": {"aws": Secret.iam_token(audience="sts", token_type="JWT-SVID")}}
        with pytest.raises(SandboxException, match=r"400: iam: .*workload identity"):
            Sandbox.create(iam=iam, **alice)
        refused = [
            ({"TOKEN": Secret.fill("api-token")}, "envVars.TOKEN: .* as the variable API_TOKEN"),
            ({"API_TOKEN": "Bearer " + Secret.fill("api-token")}, "envVars.API_TOKEN: .* whole"),
            ({"X": "${e2b.secrets.bad name}"}, "envVars.X: must be 1-128"),
        ]
        for envs, words in refused:
            with pytest.raises(SandboxException, match="400: " + words):
                Sandbox.create(envs=envs, **alice)
        with pytest.raises(SandboxException, match="404: secret NOT_SET not found"):
            Sandbox.create(envs={"NOT_SET": Secret.fill("not-set")}, **alice)
    finally:
        Secret.destroy("api-token", **alice)


def _run(sbx: Sandbox, command: str) -> str:
    return sbx.commands.run(command, envs=NO_BYPASS, timeout=30).stdout


@pytest.mark.slow
def test_a_filled_sandbox_gets_it_substituted_for_its_host_only(
    server: RunningServer, alice: dict[str, Any], bob: dict[str, Any], upstream: Upstream
) -> None:
    Secret.create("local-token", VALUE, metadata=LOCAL, **alice)
    Secret.create("far-token", OTHER, metadata={"hosts": "api.example.com"}, **alice)
    envs = {"LOCAL_TOKEN": Secret.fill("local-token"), "FAR_TOKEN": Secret.fill("far-token")}
    network = {"allow_out": [f"127.0.0.1:{upstream.port}"], "deny_out": [ALL_TRAFFIC]}
    sbx = Sandbox.create(envs=envs, network=network, **alice)
    try:
        env = _run(sbx, "env")
        assert VALUE not in env and OTHER not in env
        placeholder = _run(sbx, "printf %s $LOCAL_TOKEN")
        assert placeholder.startswith("sandcell-secret-LOCAL_TOKEN-")
        assert _run(sbx, "printf %s $FAR_TOKEN").startswith("sandcell-secret-FAR_TOKEN-")
        url = f"https://localhost:{upstream.port}"

        # Towards its host: the upstream sees the value, the cell the placeholder.
        curl = f'curl -sS --fail-with-body -H "Authorization: Bearer $LOCAL_TOKEN" {url}/mine'
        out = _run(sbx, curl)
        seen = upstream.seen.requests[-1]
        assert seen["path"] == "/mine" and seen["headers"]["authorization"] == f"Bearer {VALUE}"
        assert VALUE not in out and placeholder in out  # the echo is the placeholder again

        # Another secret's placeholder towards this host, and any over plain HTTP: refused.
        out = _run(sbx, f'curl -sS -H "x-key: $FAR_TOKEN" {url}/theirs')
        assert "'FAR_TOKEN'" in out and "localhost" in out, out
        plain = f"http://localhost:{upstream.port}/plain"
        out = _run(sbx, f'curl -sS -H "x-key: $LOCAL_TOKEN" {plain}')
        assert "plain HTTP" in out, out
        assert not {"/theirs", "/plain"} & {q["path"] for q in upstream.seen.requests}

        # E2B's header transforms cannot be added later either.
        header = {"Authorization": f"Bearer {Secret.fill('local-token')}"}
        rules = {"localhost": [{"transform": {"headers": header}}]}
        with pytest.raises(SandboxException, match=r"400: network\.rules: .* adds no headers"):
            sbx.update_network({**network, "rules": rules})

        # A rotation through e2b.Secret reaches the next connection; a deletion refuses it.
        Secret.update("local-token", VALUE + "-rotated", **alice)
        _run(sbx, f'curl -sS --fail-with-body -H "x-key: $LOCAL_TOKEN" {url}/rotated')
        assert upstream.seen.requests[-1]["headers"]["x-key"] == VALUE + "-rotated"
        Secret.destroy("local-token", **alice)
        out = _run(sbx, f'curl -sS -H "x-key: $LOCAL_TOKEN" {url}/gone')
        assert "no such secret" in out and upstream.seen.requests[-1]["path"] != "/gone"

        # Another principal cannot reach the sandbox, nor use its placeholder in his own:
        # without a secret nothing is intercepted, so the upstream gets the placeholder.
        with pytest.raises((NotFoundException, SandboxException)):
            Sandbox.connect(sbx.sandbox_id, **bob)
        his = Sandbox.create(network=network, **bob)
        try:
            header = shlex.quote(f"x-key: {placeholder}")
            _run(his, f"curl -sSk -H {header} {url}/stolen")  # -k: he lacks the test CA
        finally:
            his.kill()
        assert upstream.seen.requests[-1]["path"] == "/stolen"
        assert upstream.seen.requests[-1]["headers"]["x-key"] == placeholder
    finally:
        sbx.kill()
        Secret.destroy("far-token", **alice)
        Secret.destroy("local-token", **alice)
    assert VALUE not in server.log.read_text() and OTHER not in server.log.read_text()


# The npm SDK's Secret, and a sandbox given the secret by Secret.fill: the same façade.
JS = r"""
import assert from "node:assert/strict";
import { Sandbox, Secret, SecretNotFoundError } from "e2b";

const { VALUE, UPSTREAM } = process.env;
const made = await Secret.create("js-token", VALUE, { metadata: { hosts: "localhost" } });
assert.equal(made.name, "js_token");
assert.ok(made.secretId.startsWith("sec_") && made.version === 1 && !("value" in made));
assert.equal((await Secret.getInfo("JS-TOKEN")).secretId, made.secretId);
const rotated = await Secret.update(made.secretId, VALUE + "-2");
assert.ok(rotated.version > made.version);
assert.deepEqual((await Secret.list().nextItems()).map((s) => s.name), ["js_token"]);
const sbx = await Sandbox.create("base", {
  envs: { JS_TOKEN: Secret.fill("js-token") },
  network: { allowOut: [UPSTREAM], denyOut: ["0.0.0.0/0"] },
});
try {
  const env = { NO_PROXY: "", no_proxy: "" };
  const url = `https://localhost:${UPSTREAM.split(":")[1]}/js`;
  const out = await sbx.commands.run(`curl -sS --fail-with-body -H "x-key: $JS_TOKEN" ${url}`, {
    envs: env,
  });
  assert.ok(out.stdout.includes("sandcell-secret-JS_TOKEN-") && !out.stdout.includes(VALUE));
} finally {
  await sbx.kill();
}
assert.equal(await Secret.destroy("js-token"), true);
assert.equal(await Secret.destroy("js-token"), false);
await assert.rejects(Secret.update("js-token", VALUE), SecretNotFoundError);
console.log("ok");
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_npm_sdk(
    server: RunningServer,
    alice: dict[str, Any],
    upstream: Upstream,
    node_dir: Path,  # noqa: F811 - the fixture imported above
) -> None:
    (node_dir / "secrets.mjs").write_text(JS)
    env = {
        **os.environ,
        "E2B_API_URL": alice["api_url"],
        "E2B_SANDBOX_URL": alice["sandbox_url"],
        "E2B_API_KEY": alice["api_key"],
        "VALUE": VALUE,
        "UPSTREAM": f"127.0.0.1:{upstream.port}",
    }
    done = subprocess.run(
        ["node", "secrets.mjs"], cwd=node_dir, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout
    assert upstream.seen.requests[-1]["path"] == "/js"
    assert upstream.seen.requests[-1]["headers"]["x-key"] == VALUE + "-2"
    assert VALUE not in server.log.read_text()


def test_the_secret_routes_are_in_the_openapi_document(server: RunningServer) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert {"get", "post"} <= set(paths["/e2b/secrets"])
    assert {"get", "post", "delete"} <= set(paths["/e2b/secrets/{secret_id}"])
