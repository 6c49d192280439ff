"""E2B's per-sandbox hosts (SPEC §14.2): with `server.preview_domain` set, `{port}-{id}.{domain}`
reaches the sandbox by Host: 49983 the façade's envd, 49999 its code interpreter, any other
port the exposed-port preview. `get_host` names the configured domain. The unmodified SDK runs
with `E2B_DOMAIN` and no `E2B_SANDBOX_URL` through a TLS front on loopback (tests/support/
tls_front.py), as an operator's wildcard-certificate front; no DNS is asked."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from sdk.helpers import served
from support.server import RunningServer
from support.tls_front import tls_front

pytestmark = pytest.mark.slow

DOMAIN = "preview.test"
CONFIG = f"""
[server]
preview_domain = "{DOMAIN}"

[templates.default]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 1
idle_timeout_s = 300
"""
# Refused calls are throttled per client address: each comes from an address of its own.
_ADDRESSES = (f"127.0.{i // 250}.{i % 250 + 2}" for i in itertools.count(start=2000))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("hosts"), config_text=CONFIG)


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.create_key("hosts")


def _create(server: RunningServer, key: str) -> Sandbox:
    return Sandbox.create(
        template="base",
        timeout=300,
        api_key=key,
        api_url=f"{server.url}/e2b",
        sandbox_url=f"{server.url}/e2b",
    )


@pytest.fixture(scope="module")
def sbx(server: RunningServer, key: str) -> Iterator[Sandbox]:
    sandbox = _create(server, key)
    yield sandbox
    sandbox.kill()


@pytest.fixture(scope="module")
def other(server: RunningServer, key: str) -> Iterator[Sandbox]:
    sandbox = _create(server, key)
    yield sandbox
    sandbox.kill()


def _host(server: RunningServer, port: int, sandbox: Sandbox) -> httpx.Client:
    """A client of `{port}-{id}.{domain}`, sent to the server's address (the Host header is
    what a wildcard DNS record would have brought there)."""
    netloc = f"{port}-{sandbox.sandbox_id}.{DOMAIN}:{server.url.rsplit(':', 1)[1]}"
    transport = httpx.HTTPTransport(local_address=next(_ADDRESSES))
    return httpx.Client(
        base_url=server.url, headers={"host": netloc}, transport=transport, timeout=60
    )


def test_get_host_names_the_configured_domain(
    server: RunningServer, key: str, sbx: Sandbox
) -> None:
    # The create answer's `domain` is the preview domain, whatever E2B_DOMAIN says.
    assert sbx.sandbox_domain == DOMAIN
    assert sbx.get_host(8000) == f"8000-{sbx.sandbox_id}.{DOMAIN}"
    again = Sandbox.connect(sbx.sandbox_id, api_key=key, api_url=f"{server.url}/e2b")
    assert again.get_host(49999) == f"49999-{sbx.sandbox_id}.{DOMAIN}"


def test_envd_by_host_needs_the_hosts_own_token(
    server: RunningServer, sbx: Sandbox, other: Sandbox
) -> None:
    token = {"X-Access-Token": sbx._envd_access_token or ""}
    with _host(server, 49983, sbx) as envd:
        assert envd.get("/health", headers=token).status_code == 204
        assert envd.post("/files?path=by-host.txt", content=b"by host", headers=token).json() == [
            {"name": "by-host.txt", "type": "file", "path": "/home/user/by-host.txt"}
        ]
        assert envd.get("/files?path=by-host.txt", headers=token).content == b"by host"
        stat = envd.post(
            "/filesystem.Filesystem/Stat", json={"path": "/home/user/by-host.txt"}, headers=token
        )
        assert stat.status_code == 200 and stat.json()["entry"]["name"] == "by-host.txt"
        # The host names the sandbox: a header naming another is replaced, so the other
        # sandbox's token opens nothing here, whatever the header says.
        theirs = {
            "X-Access-Token": other._envd_access_token or "",
            "E2b-Sandbox-Id": other.sandbox_id,
        }
        refused = envd.get("/files?path=by-host.txt", headers=theirs)
        assert refused.status_code == 401
        assert refused.json() == {"code": 401, "message": "missing or wrong X-Access-Token"}
        assert envd.get("/health").status_code == 401
        # The control API is not a sandbox's host's.
        control = envd.get("/sandboxes", headers={"X-API-KEY": "anything"})
        assert control.status_code == 404
        assert control.json() == {
            "code": 404,
            "message": "/sandboxes is not served on a sandbox's host",
        }
    assert not other.files.exists("by-host.txt")


def test_a_signed_url_by_host(server: RunningServer, sbx: Sandbox) -> None:
    """The URL the SDK builds without E2B_SANDBOX_URL: `/files?...` on the sandbox's host."""
    sbx.files.write("signed-by-host.txt", "signed")
    url = sbx.download_url("signed-by-host.txt", use_signature_expiration=60)
    query = url.split("?", 1)[1]
    with _host(server, 49983, sbx) as envd:
        assert envd.get(f"/files?{query}").text == "signed"
        altered = envd.get(f"/files?{query.replace('signed-by-host', 'other')}")
        assert altered.status_code == 401 and altered.json()["message"] == "invalid signature"


def test_the_interpreter_by_host(server: RunningServer, sbx: Sandbox) -> None:
    token = {"X-Access-Token": sbx._envd_access_token or ""}
    with _host(server, 49999, sbx) as interpreter:
        answer = interpreter.post("/execute", json={"code": "6 * 7"}, headers=token)
        assert answer.status_code == 200, answer.text
        lines = [json.loads(line) for line in answer.text.splitlines() if line.strip()]
        assert any(line.get("text") == "42" for line in lines), lines
        assert interpreter.post("/execute", json={"code": "1"}).status_code == 401


def test_other_ports_stay_the_preview(server: RunningServer, sbx: Sandbox) -> None:
    """An exposed port's host is sandcell's preview (a cookie or key), not the façade's."""
    with _host(server, 8000, sbx) as preview:
        answer = preview.get("/", headers={"X-Access-Token": sbx._envd_access_token or ""})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "NOT_FOUND"  # SPEC §1's shape, not E2B's


_SDK_SCRIPT = """
import json, sys
import httpx
from e2b_code_interpreter import Sandbox

proxy, ca = sys.argv[1], sys.argv[2]
sbx = Sandbox.create(template="base", timeout=120, proxy=proxy)
try:
    seen = {"envd": sbx.envd_api_url, "host": sbx.get_host(49999)}
    sbx.files.write("/home/user/h.txt", "through the host\\n")
    seen["run"] = sbx.commands.run("cat h.txt").stdout
    seen["code"] = sbx.run_code("6 * 7").text
    url = sbx.download_url("h.txt", use_signature_expiration=60)
    seen["url"] = url.split("?")[0]
    seen["download"] = httpx.get(url, proxy=proxy, verify=ca).text
finally:
    sbx.kill()
print(json.dumps(seen))
"""


def test_the_sdk_with_e2b_domain_and_no_sandbox_url(
    server: RunningServer, key: str, tmp_path: Path
) -> None:
    """`E2B_DOMAIN` names the preview domain, no `E2B_SANDBOX_URL`: the SDK and
    e2b-code-interpreter build `https://{port}-{id}.{domain}` for envd and the interpreter
    (as e2b-code-interpreter <= 2.6 does for 49999 always), reached through the TLS front."""
    with tls_front(DOMAIN, server.url, tmp_path) as front:
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        env.update(
            E2B_API_URL=f"{server.url}/e2b",
            E2B_API_KEY=key,
            E2B_DOMAIN=DOMAIN,
            SSL_CERT_FILE=str(front.ca),
        )
        done = subprocess.run(
            [sys.executable, "-c", _SDK_SCRIPT, front.url, str(front.ca)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        connects = set(front.connects)
    sandbox_id = seen["envd"].split("-", 1)[1].split(".", 1)[0]
    assert seen["envd"] == f"https://49983-{sandbox_id}.{DOMAIN}"
    assert seen["host"] == f"49999-{sandbox_id}.{DOMAIN}"
    assert seen["run"] == "through the host\n"
    assert seen["code"] == "42"
    assert seen["url"] == f"https://49983-{sandbox_id}.{DOMAIN}/files"
    assert seen["download"] == "through the host\n"
    assert connects == {f"49983-{sandbox_id}.{DOMAIN}", f"49999-{sandbox_id}.{DOMAIN}"}
