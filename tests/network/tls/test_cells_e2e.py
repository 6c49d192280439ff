"""SPEC §17 end to end: a real `sandcell serve`, a secret set through the API, a real cell
created with it, and clients inside the cell (curl, Python's urllib, Node's TLS) reaching an
HTTPS upstream on the host's loopback (its own CA, trusted by `upstream_ca_file`). The upstream
sees the value; the cell sees only the placeholder, in its environment, its files, its
processes' environ, and every response relayed into it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from network.tls.conftest import NODE, Upstream, UpstreamCA
from support.server import OPEN_TEMPLATE, RunningServer, start_server

pytestmark = pytest.mark.slow

VALUE = "ghp_cellvalue0123456789-never-in-the-cell"
NO_BYPASS = {"NO_PROXY": "", "no_proxy": ""}  # SPEC §11: the upstream is on host loopback


CONFIG = '\n[server]\nupstream_ca_file = "{ca}"\n' + OPEN_TEMPLATE + "network_internal = true\n"


def _with_secret(c: httpx.Client, upstream: Upstream) -> str:
    body = {"name": "API_TOKEN", "value": VALUE, "hosts": ["localhost"]}
    assert c.post("/v1/secrets", json=body).status_code == 201
    network = {"egress": "allowlist", "allow": [f"127.0.0.1:{upstream.port}"]}
    r = c.post("/v1/sandboxes", json={"secrets": ["API_TOKEN"], "network": network})
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    upstream = Upstream(CA.server_context("localhost"), index_auth=f"__token__:{VALUE}".encode())
    yield upstream
    upstream.close()


CA = UpstreamCA.make()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("tls-e2e")
    (root / "upstream-ca.pem").write_bytes(CA.pem())
    config = CONFIG.format(ca=root / "upstream-ca.pem")
    srv = start_server(root / "data", config_text=config)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sandbox(server: RunningServer, upstream: Upstream) -> Iterator[tuple[httpx.Client, str]]:
    key = server.create_key("alice")
    with server.client(key) as c:
        sandbox_id = _with_secret(c, upstream)
        yield c, sandbox_id
        c.delete(f"/v1/sandboxes/{sandbox_id}")


def run(c: httpx.Client, sandbox_id: str, command: str, **env: str) -> dict:
    r = c.post(
        f"/v1/sandboxes/{sandbox_id}/exec",
        json={"command": command, "env": {**NO_BYPASS, **env}, "timeout_s": 30},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_cell_trusts_its_ca_through_the_variables(sandbox):
    c, sbx = sandbox
    env = dict(
        line.split("=", 1) for line in run(c, sbx, "env")["stdout"].splitlines() if "=" in line
    )
    assert env["API_TOKEN"].startswith("sandcell-secret-API_TOKEN-")
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                 "PIP_CERT", "GIT_SSL_CAINFO"):  # fmt: skip
        assert env[name] == "/run/sandcell/tls/ca-bundle.pem"
    out = run(c, sbx, "grep -c 'BEGIN CERTIFICATE' $SSL_CERT_FILE; touch $SSL_CERT_FILE; echo $?")
    count, touched = out["stdout"].split()
    assert int(count) > 1 and touched != "0"  # the system CAs and the sandbox's, read-only
    assert "PRIVATE KEY" not in run(c, sbx, "cat $SSL_CERT_FILE")["stdout"]


def test_curl_urllib_and_node_in_the_cell(sandbox, upstream):
    c, sbx = sandbox
    url = f"https://localhost:{upstream.port}"
    out = run(c, sbx, f'curl -sS --fail-with-body -H "Authorization: Bearer $API_TOKEN" {url}/curl')
    assert out["exit_code"] == 0, out
    assert upstream.seen.requests[-1]["headers"]["authorization"] == f"Bearer {VALUE}"
    py = (
        "python3 -c 'import os, urllib.request as u\n"
        f'r = u.Request("{url}/urllib", headers={{"x-api-key": os.environ["API_TOKEN"]}})\n'
        "print(u.urlopen(r, timeout=10).read().decode())'"
    )
    out = run(c, sbx, py)
    assert out["exit_code"] == 0, out
    assert upstream.seen.requests[-1]["headers"]["x-api-key"] == VALUE
    node = f'node -e {quote(NODE)} 3128 localhost {upstream.port} "$API_TOKEN"'
    out = run(c, sbx, node)
    assert out["stdout"].startswith("200 "), out
    assert upstream.seen.requests[-1]["headers"]["x-key"] == VALUE
    for answer in (out["stdout"],):
        assert VALUE not in answer and "sandcell-secret-API_TOKEN-" in answer


SEARCH = r"""
import os, sys
value = bytes.fromhex(sys.argv[1])[::-1]
for top in ("/workspace", "/tmp", "/run"):
    for base, _, files in os.walk(top):
        for name in files:
            try:
                if value in open(os.path.join(base, name), "rb").read():
                    print("FOUND in", os.path.join(base, name))
            except OSError:
                pass
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        if value in open(f"/proc/{pid}/environ", "rb").read():
            print("FOUND in the environ of", pid)
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")
    except OSError:
        continue
    for line in maps:
        span, perms = line.split()[:2]
        if "r" not in perms:
            continue
        lo, hi = (int(x, 16) for x in span.split("-"))
        try:
            mem.seek(lo)
            if value in mem.read(hi - lo):
                print("FOUND in the memory of", pid, line)
        except (OSError, ValueError, OverflowError):
            pass
print("searched")
"""


def test_pip_installs_from_an_index_behind_the_secret(sandbox, upstream):
    """pip trusts the bundle through PIP_CERT; the index URL's credentials carry the
    placeholder, which pip sends as Basic credentials and the proxy substitutes inside."""
    c, sbx = sandbox
    index = f"https://__token__:$API_TOKEN@localhost:{upstream.port}/simple/"
    out = run(
        c,
        sbx,
        f'python3 -m pip install --no-cache-dir --target /tmp/site --index-url "{index}" sandpkg'
        " && PYTHONPATH=/tmp/site python3 -c 'import sandpkg; print(sandpkg.VERSION)'",
    )
    assert out["exit_code"] == 0, out
    assert out["stdout"].strip().endswith("1.0")
    assert any(q["path"].startswith("/files/") for q in upstream.seen.requests)


def test_the_value_is_nowhere_in_the_cell(sandbox, upstream):
    c, sbx = sandbox
    url = f"https://localhost:{upstream.port}/split"
    out = run(c, sbx, f'curl -sS -D - -H "Authorization: $API_TOKEN" {url}')
    assert "you sent: sandcell-secret-API_TOKEN-" in out["stdout"] and VALUE not in out["stdout"]
    # A process that stays, so /proc has more than the searcher itself.
    run(c, sbx, "sleep 60 & echo started")
    # The searcher gets the value reversed and in hex, and skips its own memory: no process
    # of the cell holds the value unless the value entered the cell.
    out = run(c, sbx, f"python3 -c {quote(SEARCH)} {VALUE[::-1].encode().hex()}")
    assert out["exit_code"] == 0 and out["stdout"].strip().endswith("searched"), out
    assert "FOUND" not in out["stdout"], out["stdout"]
    # The search finds what is there: the placeholder, in environs and memory.
    placeholder = run(c, sbx, "printf %s $API_TOKEN")["stdout"]
    out = run(c, sbx, f"python3 -c {quote(SEARCH)} {placeholder[::-1].encode().hex()}")
    assert "FOUND in the environ of" in out["stdout"] and "FOUND in the memory of" in out["stdout"]


def test_plain_http_and_a_deleted_secret_are_refused(server, sandbox, upstream):
    c, sbx = sandbox
    out = run(c, sbx, f'curl -sS -H "x: $API_TOKEN" http://localhost:{upstream.port}/plain')
    assert "plain HTTP" in out["stdout"] and "API_TOKEN" in out["stdout"]
    assert c.delete("/v1/secrets/API_TOKEN").status_code in (200, 204)
    out = run(c, sbx, f'curl -sS -H "x: $API_TOKEN" https://localhost:{upstream.port}/gone')
    assert "'API_TOKEN'" in out["stdout"] and "no such secret" in out["stdout"], out
    assert all(q["path"] != "/gone" for q in upstream.seen.requests)
    metrics = httpx.get(f"{server.url}/metrics").text
    for decision in ("substituted", "refused_plain_http", "deleted"):
        line = f'sandcell_secret_uses_total{{decision="{decision}",secret="API_TOKEN"}}'
        assert line in metrics, metrics


def test_a_restart_and_a_pause_keep_substitution_working(tmp_path, upstream):
    """A restarted server keeps the CA its cells trust; a resumed sandbox (a new cell) gets
    a bundle of its own again."""
    (tmp_path / "ca.pem").write_bytes(CA.pem())
    config = CONFIG.format(ca=tmp_path / "ca.pem")
    curl = f'curl -sS --fail-with-body -H "x-key: $API_TOKEN" https://localhost:{upstream.port}/r'
    first = start_server(tmp_path / "data", config_text=config)
    try:
        key = first.create_key("bob")
        with first.client(key) as c:
            sbx = _with_secret(c, upstream)
            assert run(c, sbx, curl)["exit_code"] == 0
    finally:
        first.stop()  # the sandbox keeps running, for the next start to adopt
    second = start_server(tmp_path / "data", config_text=config)
    try:
        with second.client(key) as c:
            try:
                out = run(c, sbx, curl)
                assert out["exit_code"] == 0, out
                assert c.post(f"/v1/sandboxes/{sbx}/pause").status_code == 200
                assert c.post(f"/v1/sandboxes/{sbx}/resume").status_code == 200
                out = run(c, sbx, curl)
                assert out["exit_code"] == 0, out
                assert upstream.seen.requests[-1]["headers"]["x-key"] == VALUE
            finally:
                c.delete(f"/v1/sandboxes/{sbx}")
    finally:
        second.stop()


def quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
