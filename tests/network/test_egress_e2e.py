"""SPEC §11 end to end: a real `sandcell serve`, real cells, the proxies bridged into them, and
real servers on the host's loopback as destinations. Each refusal is a real attempt."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from wsproto.events import BytesMessage, CloseConnection, TextMessage

from sandcell import Sandbox
from sandcell.client.errors import BadRequestError, ForbiddenError
from sandcell.isolation.cell import LocalCells
from sandcell.isolation.runtime import cell_python
from sandcell.network.websocket import Rejected, Upstream
from support.host_http import host_server
from support.server import RunningServer, sandcell_bin, start_server

pytestmark = pytest.mark.slow

CONFIG = """
[server]
reap_interval_s = 1
preview_domain = "preview.test"

[templates.default]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 1
network_max = "open"
network_internal = true

[templates.strict]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 0
network = "allowlist"
network_allow = ["pypi.org", "*.pythonhosted.org"]
network_max = "allowlist"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("egress") / "data", config_text=CONFIG)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def key(server: RunningServer) -> Iterator[str]:
    key = server.create_key("alice")
    yield key
    with server.client(key) as c:  # a failed test's sandbox too: nothing stays mounted
        for sbx in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sbx['id']}")


@pytest.fixture(scope="module")
def host_ports() -> Iterator[tuple[int, int]]:
    """Two HTTP servers on the host's loopback: one to allow, one that stays refused."""
    a, port_a = host_server()
    b, port_b = host_server()
    yield port_a, port_b
    a.shutdown()
    b.shutdown()


@pytest.fixture
def client(server: RunningServer, key: str) -> Iterator[httpx.Client]:
    with server.client(key) as c:
        yield c


def create(c: httpx.Client, **body) -> str:
    r = c.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def run(c: httpx.Client, sandbox_id: str, command: str, **env: str) -> dict:
    r = c.post(
        f"/v1/sandboxes/{sandbox_id}/exec",
        json={"command": command, "env": env, "timeout_s": 30},
    )
    assert r.status_code == 200, r.text
    return r.json()


# Inside the cell: fetch a URL with urllib, honouring the proxy variables sandcell set.
FETCH = (
    "python3 -c 'import sys, urllib.request as u\n"
    "try:\n print(u.urlopen(sys.argv[1], timeout=10).read().decode())\n"
    'except Exception as e:\n print("FAILED", getattr(e, "code", ""), e)\' '
)
NO_BYPASS = {"NO_PROXY": "", "no_proxy": ""}  # SPEC §11: reaching a host loopback address
DIRECT = (
    "python3 -c 'import socket, sys\n"
    'try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print("OPEN")\n'
    'except OSError as e:\n print("FAILED", e)\' '
)
SOCKS = (
    "python3 -c 'import socket, struct, sys\n"
    's = socket.create_connection(("127.0.0.1", 1080), timeout=5)\n'
    's.sendall(b"\\x05\\x01\\x00"); assert s.recv(2) == b"\\x05\\x00"\n'
    "host = sys.argv[1].encode()\n"
    's.sendall(b"\\x05\\x01\\x00\\x03" + bytes([len(host)]) + host'
    ' + struct.pack("!H", int(sys.argv[2])))\n'
    'print("REPLY", s.recv(10)[1])\' '
)


def test_with_no_policy_nothing_leaves(client, host_ports):
    sbx = create(client)
    port = host_ports[0]
    env = run(client, sbx, "env")["stdout"]
    assert "HTTP_PROXY" not in env and "ALL_PROXY" not in env
    # Direct TCP: the cell's 127.0.0.1 is its own; nothing of the host is there.
    assert "FAILED" in run(client, sbx, DIRECT + f"127.0.0.1 {port}")["stdout"]
    # The proxies: there, but refusing.
    out = run(client, sbx, FETCH + f"http://127.0.0.1:{port}/", HTTP_PROXY="http://127.0.0.1:3128")
    assert "FAILED 403" in out["stdout"]
    assert "REPLY 2" in run(client, sbx, SOCKS + f"127.0.0.1 {port}")["stdout"]
    # The listeners are the host's, bound before any tenant code ran: they cannot be taken.
    grab = run(
        client,
        sbx,
        "python3 -c 'import socket\nfor port in (3128, 1080):\n s = socket.socket()\n"
        " s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        " s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
        ' try:\n  s.bind(("127.0.0.1", port)); print("BOUND", port)\n'
        ' except OSError as e:\n  print("REFUSED", e.errno)\'',
    )
    assert grab["stdout"].split() == ["REFUSED", "98", "REFUSED", "98"], grab
    # DNS: no resolver is reachable from the cell.
    dns = run(client, sbx, "python3 -c 'import socket; socket.getaddrinfo(\"pypi.org\", 443)'")
    assert dns["exit_code"] != 0 and "gaierror" in dns["stderr"]
    client.delete(f"/v1/sandboxes/{sbx}")


def test_an_allow_listed_host_server_is_reached_by_python_and_curl(client, host_ports):
    allowed, other = host_ports
    sbx = create(client, network={"egress": "allowlist", "allow": [f"127.0.0.1:{allowed}"]})
    env = run(client, sbx, "env")["stdout"]
    assert "HTTP_PROXY=http://127.0.0.1:3128" in env and "ALL_PROXY=http://127.0.0.1:3128" in env
    out = run(client, sbx, FETCH + f"http://127.0.0.1:{allowed}/py", **NO_BYPASS)
    assert out["stdout"].strip() == "hello from the host, /py"
    # httpx as the openai and anthropic SDKs make it, from the proxy variables alone, without
    # socksio (which it wants for a SOCKS ALL_PROXY before it sends anything).
    stock = f"{cell_python()} -c 'import httpx, sys; print(httpx.Client().get(sys.argv[1]).text)' "
    out = run(client, sbx, stock + f"http://127.0.0.1:{allowed}/httpx", **NO_BYPASS)
    assert out["stdout"].strip() == "hello from the host, /httpx", out
    out = run(client, sbx, f"curl -sS http://127.0.0.1:{allowed}/curl", **NO_BYPASS)
    assert out["stdout"] == "hello from the host, /curl"
    # Another port of the same host: refused, by the proxy, with the reason.
    out = run(client, sbx, f"curl -sS -i http://127.0.0.1:{other}/", **NO_BYPASS)
    assert out["stdout"].startswith("HTTP/1.1 403") and "host-internal" in out["stdout"]
    # CONNECT to the refused port; SOCKS to it; the allowed one through SOCKS.
    out = run(
        client,
        sbx,
        f"curl -sS -p -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{other}/",
        **NO_BYPASS,
    )
    assert "403" in out["stdout"] + out["stderr"]
    assert "REPLY 2" in run(client, sbx, SOCKS + f"127.0.0.1 {other}")["stdout"]
    socks = f"curl -sS --socks5-hostname 127.0.0.1:1080 http://127.0.0.1:{allowed}/s"
    out = run(client, sbx, socks, **NO_BYPASS)
    assert out["stdout"] == "hello from the host, /s"
    client.delete(f"/v1/sandboxes/{sbx}")


def test_open_mode_still_refuses_the_router_redis_and_metadata(
    server, client, host_ports, redis_url
):
    sbx = create(client, network={"egress": "open"})
    router_port = urlsplit(server.url).port
    redis_port = urlsplit(redis_url).port
    for target in (
        f"127.0.0.1:{router_port}",
        f"127.0.0.1:{redis_port}",
        "169.254.169.254:80",
        f"localhost:{host_ports[0]}",
    ):
        out = run(client, sbx, f"curl -sS -i http://{target}/", **NO_BYPASS)
        assert out["stdout"].startswith("HTTP/1.1 403"), (target, out)
        assert "host-internal" in out["stdout"]
    client.delete(f"/v1/sandboxes/{sbx}")


def test_a_name_resolving_to_a_refused_address_is_refused(client, host_ports):
    """`localhost` is allowed by name; it resolves (on the host) to 127.0.0.1, which no entry
    names by address: refused, whatever the name later resolves to."""
    sbx = create(client, network={"allow": [f"localhost:{host_ports[0]}"]})
    out = run(client, sbx, f"curl -sS -i http://localhost:{host_ports[0]}/", **NO_BYPASS)
    assert out["stdout"].startswith("HTTP/1.1 403") and "127.0.0.1" in out["stdout"]
    client.delete(f"/v1/sandboxes/{sbx}")


def test_a_live_policy_change_applies_to_new_connections(client, host_ports):
    port = host_ports[0]
    sbx = create(client, network={"egress": "allowlist", "allow": []})
    url = f"http://127.0.0.1:{port}/live"
    assert "FAILED 403" in run(client, sbx, FETCH + url, **NO_BYPASS)["stdout"]
    r = client.patch(f"/v1/sandboxes/{sbx}/network", json={"allow": [f"127.0.0.1:{port}"]})
    assert r.status_code == 200 and r.json()["network"]["allow"] == [f"127.0.0.1:{port}"]
    assert "hello from the host" in run(client, sbx, FETCH + url, **NO_BYPASS)["stdout"]
    assert client.patch(f"/v1/sandboxes/{sbx}/network", json={"egress": "none"}).status_code == 200
    out = run(client, sbx, FETCH + url, **NO_BYPASS)["stdout"]
    assert "FAILED" in out and "hello" not in out  # no proxy variables now: no way out
    client.delete(f"/v1/sandboxes/{sbx}")


PROXY_VARS = "printenv HTTP_PROXY HTTPS_PROXY http_proxy https_proxy ALL_PROXY NO_PROXY KEEP"
CURL = "curl -sS --max-time 10 "


def test_a_live_change_from_none_gives_later_commands_the_proxy_variables(client, host_ports):
    """Hole 13 of issue 26: after a PATCH from `none` the proxies listened, but commands had
    no proxy variables (they are set in the daemon's default env at create): curl went to the
    cell's own loopback. Now the manager sends the daemon the new default env, signed."""
    port = host_ports[0]
    sbx = create(client, network={"egress": "none"}, env={"KEEP": "kept"})
    url = f"http://127.0.0.1:{port}/via-curl"
    before = run(client, sbx, PROXY_VARS)
    assert before["stdout"] == "kept\n"
    assert "hello" not in run(client, sbx, CURL + url, **NO_BYPASS)["stdout"]
    r = client.patch(f"/v1/sandboxes/{sbx}/network", json={"allow": [f"127.0.0.1:{port}"]})
    assert r.status_code == 200, r.text
    proxy = "http://127.0.0.1:3128"
    assert run(client, sbx, PROXY_VARS)["stdout"].split() == [
        *[proxy] * 5,
        "localhost,127.0.0.1",
        "kept",
    ]
    reached = run(client, sbx, CURL + url, **NO_BYPASS)
    assert reached["stdout"] == "hello from the host, /via-curl", reached
    assert client.patch(f"/v1/sandboxes/{sbx}/network", json={"egress": "none"}).status_code == 200
    assert run(client, sbx, PROXY_VARS)["stdout"] == "kept\n"
    refused = run(client, sbx, CURL + url, **NO_BYPASS)
    assert refused["exit_code"] != 0 and "hello" not in refused["stdout"], refused
    # The daemon's env endpoint is the manager's: the router's relay of /v1 cannot reach it.
    assert client.put(f"/v1/sandboxes/{sbx}/env", json={"env": {}}).status_code == 404
    client.delete(f"/v1/sandboxes/{sbx}")


def test_caps_and_malformed_policies(client):
    r = client.post("/v1/sandboxes", json={"template": "strict", "network": {"egress": "open"}})
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    r = client.post("/v1/sandboxes", json={"network": {"allow": ["pypi.org", "10.0.0.0/33"]}})
    assert r.status_code == 400 and "10.0.0.0/33" in r.json()["error"]["message"]
    r = client.post("/v1/sandboxes", json={"network": {"egress": "everything"}})
    assert r.status_code == 400
    r = client.post(
        "/v1/sandboxes", json={"template": "strict", "network": {"allow": ["127.0.0.1"]}}
    )
    assert r.status_code == 403 and "127.0.0.1" in r.json()["error"]["message"]
    sbx = create(client, template="strict")
    assert client.get(f"/v1/sandboxes/{sbx}").json()["network"] == {
        "egress": "allowlist",
        "allow": ["pypi.org", "*.pythonhosted.org"],
        "deny": [],
    }
    r = client.patch(f"/v1/sandboxes/{sbx}/network", json={"egress": "open"})
    assert r.status_code == 403
    r = client.patch(f"/v1/sandboxes/{sbx}/network", json={"allow": ["bad name!"]})
    assert r.status_code == 400 and "bad name!" in r.json()["error"]["message"]
    client.delete(f"/v1/sandboxes/{sbx}")


def test_egress_decisions_are_counted_in_metrics(server, client, host_ports):
    sbx = create(client, network={"allow": [f"127.0.0.1:{host_ports[0]}"]})
    run(client, sbx, FETCH + f"http://127.0.0.1:{host_ports[0]}/m", **NO_BYPASS)
    run(client, sbx, FETCH + f"http://127.0.0.1:{host_ports[1]}/m", **NO_BYPASS)
    text = httpx.get(f"{server.url}/metrics").text
    assert 'sandcell_egress_total{decision="allowed"}' in text
    assert 'sandcell_egress_total{decision="refused"}' in text
    assert 'sandcell_egress_bytes_total{direction="in"}' in text
    assert f"sandbox={sbx}" in server.log.read_text()
    client.delete(f"/v1/sandboxes/{sbx}")


# -- exposed ports and preview URLs -------------------------------------------------------


def _serve_in_cell(client: httpx.Client, sbx: str, port: int) -> None:
    run(
        client,
        sbx,
        f"echo served > index.txt; nohup python3 -m http.server {port} >/tmp/http.log 2>&1 &",
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if client.get(f"/v1/sandboxes/{sbx}/ports/{port}/index.txt").status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError("the server in the cell did not come up")


def test_an_exposed_port_through_the_api_and_a_preview_url(server, client):
    sbx = create(client)  # egress "none": exposed ports work under every policy
    assert client.get(f"/v1/sandboxes/{sbx}/ports/8000/").status_code == 502  # nothing there
    _serve_in_cell(client, sbx, 8000)
    r = client.get(f"/v1/sandboxes/{sbx}/ports/8000/index.txt")
    assert r.status_code == 200 and r.text == "served\n"
    assert client.get(f"/v1/sandboxes/{sbx}/ports/8000/missing").status_code == 404
    assert httpx.get(f"{server.url}/v1/sandboxes/{sbx}/ports/8000/index.txt").status_code == 401
    r = client.post(f"/v1/sandboxes/{sbx}/ports/8000/url", json={"expires_in_s": 600})
    assert r.status_code == 200, r.text
    url = r.json()["url"]
    assert url.startswith(server.url + "/p/")
    assert httpx.get(url + "index.txt").text == "served\n"  # no API key
    short = client.post(f"/v1/sandboxes/{sbx}/ports/8000/url", json={"expires_in_s": 1})
    forged = url.replace("/p/", "/p/x")
    assert httpx.get(forged + "index.txt").status_code == 404
    tampered = url.split(".8000.")[0] + ".8001." + url.split(".8000.")[1]
    assert httpx.get(tampered + "index.txt").status_code == 404
    time.sleep(1.2)
    assert httpx.get(short.json()["url"] + "index.txt").status_code == 404  # expired
    assert client.delete(f"/v1/sandboxes/{sbx}").status_code == 204
    gone = httpx.get(url + "index.txt")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "NOT_FOUND"


def test_host_based_preview_routing(server, client, key):
    """`{port}-{id}.{preview_domain}`: the token is traded for a host-only cookie, then the
    cookie (or the API key) opens the app at the root of its own host."""
    sbx = create(client)
    _serve_in_cell(client, sbx, 8002)
    answer = client.post(f"/v1/sandboxes/{sbx}/ports/8002/url").json()
    router_port = urlsplit(server.url).port
    host = f"8002-{sbx}.preview.test:{router_port}"
    host_url = urlsplit(answer["host_url"])
    assert host_url.netloc == host
    with httpx.Client(base_url=server.url, headers={"host": host}) as browser:
        assert browser.get("/index.txt").status_code == 404  # no cookie, no key
        traded = browser.get(f"/index.txt?{host_url.query}&x=1")
        assert traded.status_code == 303 and traded.headers["location"] == "/index.txt?x=1"
        assert "httponly" in traded.headers["set-cookie"].lower()
        r = browser.get("/index.txt")  # the cookie jar now holds the token
        assert r.status_code == 200 and r.text == "served\n"
        assert browser.get("/").status_code == 200  # the app's root is the host's root
    with httpx.Client(base_url=server.url, headers={"host": f"8003-{sbx}.preview.test"}) as other:
        other.cookies.set("sandcell_preview", host_url.query.split("=", 1)[1])
        assert other.get("/index.txt").status_code == 404  # the token names port 8002
    keyed = httpx.get(
        f"{server.url}/index.txt", headers={"host": host, "authorization": f"Bearer {key}"}
    )
    assert keyed.status_code == 200
    client.delete(f"/v1/sandboxes/{sbx}")
    with httpx.Client(base_url=server.url, headers={"host": host}) as browser:
        browser.cookies.set("sandcell_preview", host_url.query.split("=", 1)[1])
        assert browser.get("/index.txt").status_code == 404  # dies with the sandbox


@pytest.mark.skipif(os.environ.get("SANDCELL_TEST_NETWORK") != "1", reason="needs the internet")
def test_pip_install_through_an_allow_list(client):
    sbx = create(client, template="strict")
    out = run(
        client,
        sbx,
        "python3 -m pip install --user --break-system-packages --no-cache-dir six && "
        "python3 -c 'import six; print(six.__version__)'",
    )
    assert out["exit_code"] == 0, out
    assert json.dumps(out)  # the output names the version installed
    client.delete(f"/v1/sandboxes/{sbx}")


# -- SDK and CLI ----------------------------------------------------------------------------


def test_sdk_network_policy_and_preview_url(server, key, host_ports):
    allowed = f"127.0.0.1:{host_ports[0]}"
    with pytest.raises(ForbiddenError, match="wider"):
        Sandbox.create("strict", network={"egress": "open"}, url=server.url, api_key=key)
    closed = {"egress": "allowlist", "allow": []}
    with Sandbox.create(network=closed, url=server.url, api_key=key) as sbx:
        fetch = FETCH + f"http://{allowed}/sdk"
        assert "FAILED 403" in sbx.commands.run(fetch, env=NO_BYPASS).stdout
        info = sbx.set_network({"allow": [allowed]})
        assert info.network["allow"] == [allowed] and sbx.info().network["egress"] == "allowlist"
        assert "hello from the host" in sbx.commands.run(fetch, env=NO_BYPASS).stdout
        with pytest.raises(BadRequestError, match=r"300\.1\.1\.1"):
            sbx.set_network({"allow": ["300.1.1.1"]})
        sbx.commands.run(
            "echo via-sdk > index.txt; nohup python3 -m http.server 8001 >/dev/null 2>&1 &"
        )
        preview = sbx.get_url(8001, expires_in_s=60)
        deadline = time.monotonic() + 10
        while (r := httpx.get(preview + "index.txt")).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
        assert r.text == "via-sdk\n"


def test_cli_create_with_allow_and_url(server, key):
    env = {**os.environ, "SANDCELL_URL": server.url, "SANDCELL_API_KEY": key}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sandcell_bin(), *args], env=env, capture_output=True, text=True, timeout=60
        )

    done = cli("create", "--allow", "pypi.org", "--allow", "*.pythonhosted.org")
    assert done.returncode == 0, done.stderr
    sbx = done.stdout.strip()
    with server.client(key) as c:
        assert c.get(f"/v1/sandboxes/{sbx}").json()["network"] == {
            "egress": "allowlist",
            "allow": ["pypi.org", "*.pythonhosted.org"],
            "deny": [],
        }
    done = cli("url", sbx, "8000", "--expires-in", "60")
    assert done.returncode == 0 and done.stdout.startswith(f"{server.url}/p/sbx-")
    done = cli("network", sbx, "--egress", "none", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["egress"] == "none"
    bad = cli("create", "--allow", "not a host")
    assert bad.returncode == 1 and "BAD_REQUEST" in bad.stderr and "not a host" in bad.stderr
    assert cli("rm", sbx).returncode == 0


def test_egress_survives_a_server_restart(tmp_path, host_ports):
    """A restarted server adopts live sandboxes and makes their proxies' listeners again."""
    data = tmp_path / "data"
    first = start_server(data, config_text=CONFIG.replace("warm_pool = 1", "warm_pool = 0"))
    key = first.create_key("restart")
    allowed = f"127.0.0.1:{host_ports[0]}"
    with first.client(key) as c:
        sbx = create(c, network={"allow": [allowed]})
    first.stop()
    second = start_server(data, config_text=first.config.read_text())
    try:
        with second.client(key) as c:
            out = run(c, sbx, FETCH + f"http://{allowed}/again", **NO_BYPASS)
            assert out["stdout"].strip() == "hello from the host, /again"
            assert c.delete(f"/v1/sandboxes/{sbx}").status_code == 204
    finally:
        second.stop()
        LocalCells(data / "cells").destroy_all()  # what a failure left: live cells outlive a stop


# A WebSocket echo server with nothing but the standard library, run inside the cell.
WS_ECHO = r"""
import asyncio, base64, hashlib, struct
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
async def serve(r, w):
    lines = (await r.readuntil(b"\r\n\r\n")).split(b"\r\n")
    key = [x.split(b":", 1)[1].strip() for x in lines if x.lower().startswith(b"sec-websocket-k")]
    accept = base64.b64encode(hashlib.sha1(key[0] + GUID).digest())
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        b1, b2 = await r.readexactly(2)
        op, n = b1 & 15, b2 & 127
        if n == 126:
            n = struct.unpack("!H", await r.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await r.readexactly(8))[0]
        mask = await r.readexactly(4)
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(n)))
        if op == 8:
            w.write(b"\x88\x02\x03\xe8"); await w.drain(); w.close(); return
        if op == 1:
            data = b"echo " + lines[0].split(b" ")[1] + b" " + data
        size = bytes([len(data)]) if len(data) < 126 else b"\x7e" + struct.pack("!H", len(data))
        w.write(bytes([128 | op]) + size + data); await w.drain()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 8765)
    await server.serve_forever()
asyncio.run(main())
"""


async def _ws_exchange(base: str, target: str, headers=()) -> list:
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    upstream = Upstream(reader, writer)
    try:
        await upstream.handshake(url.netloc, target, headers=headers)
        upstream.send(TextMessage(data="hi"))
        upstream.send(BytesMessage(data=b"\x00\x01" * 20_000))
        got = []
        while len(got) < 2 and (event := await asyncio.wait_for(upstream.next_event(), 10)):
            got.append(event)
        upstream.send(CloseConnection(code=1000))
        got.append(await asyncio.wait_for(upstream.next_event(), 10))
        return got
    finally:
        upstream.close()


def test_websockets_to_an_exposed_port_and_through_a_preview_url(server, client, key):
    sbx = create(client)
    assert (
        client.put(
            f"/v1/sandboxes/{sbx}/files", params={"path": "ws_echo.py"}, content=WS_ECHO.encode()
        ).status_code
        == 200
    )
    run(client, sbx, "nohup python3 ws_echo.py >/tmp/ws.log 2>&1 &")
    auth = [(b"authorization", f"Bearer {key}".encode())]
    target = f"/v1/sandboxes/{sbx}/ports/8765/chat?x=1"
    deadline = time.monotonic() + 10
    while True:
        try:
            events = asyncio.run(_ws_exchange(server.url, target, auth))
            break
        except Rejected:
            assert time.monotonic() < deadline, "the WebSocket server did not come up"
            time.sleep(0.2)
    assert events[0].data == "echo /chat?x=1 hi"
    assert bytes(events[1].data) == b"\x00\x01" * 20_000
    assert events[-1].code == 1000
    with pytest.raises(Rejected):  # no API key
        asyncio.run(_ws_exchange(server.url, target))
    with pytest.raises(Rejected):  # nothing listening on that port
        asyncio.run(_ws_exchange(server.url, f"/v1/sandboxes/{sbx}/ports/8766/", auth))
    preview = urlsplit(client.post(f"/v1/sandboxes/{sbx}/ports/8765/url").json()["url"])
    events = asyncio.run(_ws_exchange(server.url, preview.path + "room"))
    assert events[0].data == "echo /room hi"
    client.delete(f"/v1/sandboxes/{sbx}")
    with pytest.raises(Rejected):  # dies with the sandbox
        asyncio.run(_ws_exchange(server.url, preview.path + "room"))
