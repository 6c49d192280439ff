"""SPEC §17 at the proxy: placeholders become values only over TLS, only towards the hosts
their secret names, only where it allows; the upstream sees the value, the client never does.
Clients are real (httpx, requests, curl, Node's TLS stack), the upstreams real HTTPS servers
on loopback with a CA of the test's own."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess

import httpx
import pytest
import requests

from network.tls.conftest import (
    NODE,
    OTHER_PLACEHOLDER,
    PLACEHOLDER,
    VALUE,
    UpstreamCA,
    binding,
    other_binding,
)

pytestmark = pytest.mark.anyio


def client(secrets, sandbox_id: str = "sbx-a", bundle=None) -> httpx.AsyncClient:
    verify = ssl.create_default_context(cafile=str(bundle or secrets.bundle(sandbox_id)))
    return httpx.AsyncClient(proxy=secrets.url(sandbox_id), verify=verify, timeout=10)


@pytest.fixture
def api(secrets, upstreams):
    """api.test, with the API_TOKEN secret naming it; other.test with OTHER_TOKEN."""
    api, other = upstreams("api.test"), upstreams("other.test")
    secrets.allow(api.port, other.port)
    secrets.bindings["sbx-a"] = (binding(), other_binding())
    return api, other


async def test_a_header_placeholder_reaches_the_upstream_as_the_value(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        r = await c.get(
            f"https://api.test:{upstream.port}/v1/models",
            headers={"authorization": f"Bearer {PLACEHOLDER}"},
        )
    assert r.status_code == 200, r.text
    assert upstream.seen.requests[-1]["headers"]["authorization"] == f"Bearer {VALUE.decode()}"
    # The upstream's answer echoes what it got: the client sees the placeholder, not the value.
    assert VALUE not in r.content and PLACEHOLDER in r.text
    assert int(r.headers["content-length"]) == len(r.content)  # the echo's length, kept right
    assert ("sbx-a", "API_TOKEN", "api.test", "substituted") in secrets.uses


async def test_keep_alive_carries_several_requests(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        for i in range(3):
            r = await c.post(
                f"https://api.test:{upstream.port}/n{i}",
                headers={"x-key": PLACEHOLDER},
                content=b"x" * 1000,
            )
            assert r.status_code == 200
    assert [q["headers"]["x-key"] for q in upstream.seen.requests] == [VALUE.decode()] * 3


async def test_an_echo_split_across_chunks_is_replaced(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        r = await c.get(
            f"https://api.test:{upstream.port}/split", headers={"authorization": PLACEHOLDER}
        )
    assert r.status_code == 200
    assert r.content == f"you sent: {PLACEHOLDER} and again {PLACEHOLDER}".encode()
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.headers["x-echo"] == PLACEHOLDER


async def test_the_query_needs_its_opt_in(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{upstream.port}/q?key={PLACEHOLDER}")
    assert r.status_code == 403
    assert "API_TOKEN" in r.text and "api.test" in r.text and "query" in r.text
    assert upstream.seen.requests == []
    assert ("sbx-a", "API_TOKEN", "api.test", "refused_place") in secrets.uses
    secrets.bindings["sbx-a"] = (binding(("headers", "query")),)
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{upstream.port}/q?key={PLACEHOLDER}")
    assert r.status_code == 200
    assert upstream.seen.requests[-1]["path"] == f"/q?key={VALUE.decode()}"


async def test_the_body_needs_its_opt_in(secrets, api):
    upstream, _ = api
    payload = json.dumps({"token": PLACEHOLDER, "pad": "y" * 200_000}).encode()
    async with client(secrets) as c:
        r = await c.post(f"https://api.test:{upstream.port}/b", content=payload)
    assert r.status_code == 403 and "body" in r.text and "API_TOKEN" in r.text
    assert all(PLACEHOLDER not in q["body"] for q in upstream.seen.requests)
    secrets.bindings["sbx-a"] = (binding(("headers", "body")),)
    async with client(secrets) as c:
        r = await c.post(f"https://api.test:{upstream.port}/b", content=payload)
        assert r.status_code == 200, r.text
        seen = upstream.seen.requests[-1]
        assert json.loads(seen["body"])["token"] == VALUE.decode()
        assert int(seen["headers"]["content-length"]) == len(seen["body"].encode("latin-1"))

        async def chunks():
            yield payload[:15]  # the placeholder split across three chunks
            yield payload[15:20]
            for i in range(20, len(payload), 4096):
                yield payload[i : i + 4096]

        r = await c.post(f"https://api.test:{upstream.port}/c", content=chunks())
        assert r.status_code == 200, r.text
    seen = upstream.seen.requests[-1]
    assert seen["headers"]["transfer-encoding"] == "chunked"
    assert json.loads(seen["body"])["token"] == VALUE.decode()
    assert VALUE not in r.content


async def test_a_placeholder_towards_another_host_is_refused(secrets, api):
    upstream, other = api
    async with client(secrets) as c:
        r = await c.get(f"https://other.test:{other.port}/", headers={"x-key": PLACEHOLDER})
        assert r.status_code == 403
        assert "API_TOKEN" in r.text and "other.test" in r.text
        r = await c.get(f"https://api.test:{upstream.port}/", headers={"x-key": OTHER_PLACEHOLDER})
        assert r.status_code == 403 and "OTHER_TOKEN" in r.text and "api.test" in r.text
    assert other.seen.requests == [] and upstream.seen.requests == []
    assert ("sbx-a", "API_TOKEN", "other.test", "refused_host") in secrets.uses


async def test_a_placeholder_over_plain_http_is_refused(secrets, api):
    upstream, _ = api
    async with httpx.AsyncClient(proxy=secrets.url(), timeout=10) as c:
        r = await c.get(f"http://api.test:{upstream.port}/", headers={"x-key": PLACEHOLDER})
    assert r.status_code == 403
    assert "API_TOKEN" in r.text and "api.test" in r.text and "plain HTTP" in r.text
    assert ("sbx-a", "API_TOKEN", "api.test", "refused_plain_http") in secrets.uses


async def test_after_the_secret_is_gone_its_placeholder_is_refused(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{upstream.port}/", headers={"x-key": PLACEHOLDER})
        assert r.status_code == 200
    secrets.bindings["sbx-a"] = ()  # deleted: the next connection's lookup has nothing
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{upstream.port}/", headers={"x-key": PLACEHOLDER})
    assert r.status_code == 403 and "API_TOKEN" in r.text
    assert len(upstream.seen.requests) == 1
    assert ("sbx-a", "API_TOKEN", "api.test", "deleted") in secrets.uses


async def test_a_rotation_applies_to_the_next_connection(secrets, api):
    upstream, _ = api
    secrets.bindings["sbx-a"] = (binding(value=b"rotated-value-42"),)
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{upstream.port}/", headers={"x-key": PLACEHOLDER})
    assert r.status_code == 200
    assert upstream.seen.requests[-1]["headers"]["x-key"] == "rotated-value-42"


async def test_other_hosts_stay_untouched_tunnels(secrets, upstreams, test_ca):
    plain = upstreams("plain.test")
    secrets.allow(plain.port)
    secrets.bindings["sbx-a"] = (binding(),)
    # The client trusts only the upstream's own CA: the real certificate arrived untouched.
    verify = ssl.create_default_context(cadata=test_ca.pem().decode())
    async with httpx.AsyncClient(proxy=secrets.url(), verify=verify, timeout=10) as c:
        r = await c.get(f"https://plain.test:{plain.port}/", headers={"x-key": PLACEHOLDER})
    assert r.status_code == 200
    assert plain.seen.requests[-1]["headers"]["x-key"] == PLACEHOLDER  # nothing substituted


@pytest.mark.parametrize("forgery", ["wrong host", "expired", "unknown CA"])
async def test_a_forged_upstream_certificate_fails_the_request(secrets, upstreams, forgery):
    upstream = {
        "wrong host": lambda: upstreams("wrong.test"),
        "expired": lambda: upstreams("api.test", expired=True),
        "unknown CA": lambda: upstreams("api.test", ca=UpstreamCA.make("someone else")),
    }[forgery]()
    secrets.allow(upstream.port)
    secrets.bindings["sbx-a"] = (binding(),)
    async with client(secrets) as c:
        with pytest.raises(httpx.ProxyError, match="502"):
            await c.get(f"https://api.test:{upstream.port}/", headers={"x-key": PLACEHOLDER})
    assert upstream.seen.requests == []
    reader, writer = await asyncio.open_connection("127.0.0.1", secrets.ports["sbx-a"])
    writer.write(f"CONNECT api.test:{upstream.port} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 502") and b"failed verification" in answer


async def test_a_sandbox_cannot_use_another_sandboxs_ca(secrets, api):
    upstream, _ = api
    secrets.bindings["sbx-b"] = (binding(placeholder="sandcell-secret-API_TOKEN-bbbbbb"),)
    secrets.policies["sbx-b"] = secrets.policies["sbx-a"]
    bundle_a = secrets.bundle("sbx-a")
    # sbx-b's proxy presents sbx-b's leaf: a client trusting sbx-a's bundle refuses it.
    async with client(secrets, "sbx-b", bundle=bundle_a) as c:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await c.get(f"https://api.test:{upstream.port}/")
    # And sbx-a's placeholder means nothing to sbx-b's proxy: it is refused there.
    async with client(secrets, "sbx-b") as c:
        r = await c.get(f"https://api.test:{upstream.port}/", headers={"x-key": PLACEHOLDER})
    assert r.status_code == 403
    assert upstream.seen.requests == []


async def test_the_ca_is_constrained_and_its_key_stays_beside_the_cells_directory(secrets, api):
    trust = secrets.substitution.authorities.trust_for("sbx-a", {"api.test", "other.test"})
    assert trust.bundle.stat().st_mode & 0o777 == 0o444
    assert [p.name for p in trust.directory.iterdir()] == ["ca-bundle.pem"]  # what cells bind
    text = trust.bundle.read_bytes()
    assert b"PRIVATE KEY" not in text and VALUE not in text
    key = trust.directory.parent / "ca-key.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    assert trust.directory.parent.stat().st_mode & 0o777 == 0o700
    ca = secrets.substitution.authorities.known("sbx-a")
    assert ca is not None and ca.hosts == {"api.test", "other.test"}
    from cryptography import x509

    constraints = ca.cert.extensions.get_extension_for_class(x509.NameConstraints).value
    assert {n.value for n in constraints.permitted_subtrees} == {"api.test", "other.test"}
    # A restarted server (a new Authorities on the same directory) keeps the CA cells trust.
    from sandcell.network.tls.authority import Authorities

    again = Authorities(secrets.root / "tls").of("sbx-a")
    assert again.cert == ca.cert and again.hosts == ca.hosts
    secrets.substitution.forget("sbx-a")
    assert not trust.directory.parent.exists()


async def test_alpn_offers_http_1_1_only(secrets, api):
    upstream, _ = api
    for offered, chosen in ((["h2", "http/1.1"], "http/1.1"), (["h2"], None)):
        reader, writer = await asyncio.open_connection("127.0.0.1", secrets.ports["sbx-a"])
        writer.write(f"CONNECT api.test:{upstream.port} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        context = ssl.create_default_context(cafile=str(secrets.bundle()))
        context.set_alpn_protocols(offered)
        await writer.start_tls(context, server_hostname="api.test")
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == chosen
        writer.close()


async def curl(*args: str) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode is not None
    return proc.returncode, out, err


async def test_http2_clients_get_http_1_1_or_fail(secrets, api):
    upstream, _ = api
    common = ["--proxy", secrets.url(), "--cacert", str(secrets.bundle())]
    url = f"https://api.test:{upstream.port}/h2"
    code, out, err = await curl(*common, "--http2", "-H", f"x-key: {PLACEHOLDER}", url)
    assert code == 0 and PLACEHOLDER.encode() in out, err  # ALPN fell back to HTTP/1.1
    # HTTP/2 spoken without negotiating it: the relay speaks HTTP/1.1 only, and says so.
    reader, writer = await asyncio.open_connection("127.0.0.1", secrets.ports["sbx-a"])
    writer.write(f"CONNECT api.test:{upstream.port} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    await writer.start_tls(
        ssl.create_default_context(cafile=str(secrets.bundle())), server_hostname="api.test"
    )
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert len(upstream.seen.requests) == 1


# -- real clients ----------------------------------------------------------------------------


async def test_curl(secrets, api):
    upstream, _ = api
    code, out, err = await curl(
        "--fail-with-body", "--proxy", secrets.url(), "--cacert", str(secrets.bundle()),
        "-H", f"Authorization: Bearer {PLACEHOLDER}", f"https://api.test:{upstream.port}/curl",
    )  # fmt: skip
    assert code == 0, err
    assert VALUE not in out and PLACEHOLDER.encode() in out
    assert upstream.seen.requests[-1]["headers"]["authorization"] == f"Bearer {VALUE.decode()}"


async def test_requests(secrets, api):
    upstream, _ = api
    bundle = str(secrets.bundle())

    def call() -> requests.Response:
        with requests.Session() as session:
            session.trust_env = False
            return session.post(
                f"https://api.test:{upstream.port}/requests",
                headers={"x-api-key": PLACEHOLDER},
                json={"hello": "world"},
                proxies={"https": secrets.url()},
                verify=bundle,
                timeout=10,
            )

    r = await asyncio.to_thread(call)
    assert r.status_code == 200, r.text
    assert VALUE not in r.content and PLACEHOLDER in r.text
    assert upstream.seen.requests[-1]["headers"]["x-api-key"] == VALUE.decode()


async def test_node_trusts_the_bundle_through_node_extra_ca_certs(secrets, api):
    upstream, _ = api
    args = [secrets.ports["sbx-a"], "api.test", upstream.port, PLACEHOLDER]

    async def node(env: dict[str, str]) -> bytes:
        proc = await asyncio.create_subprocess_exec(
            "node", "-e", NODE, *map(str, args), env=env, stdout=subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
        return out

    out = await node({"NODE_EXTRA_CA_CERTS": str(secrets.bundle()), "PATH": "/usr/bin"})
    assert out.startswith(b"200 "), out
    assert VALUE not in out and PLACEHOLDER.encode() in out
    assert upstream.seen.requests[-1]["headers"]["x-key"] == VALUE.decode()
    # Without the bundle Node refuses the sandbox's leaf: the CA is what it trusts.
    assert b"ERROR" in await node({"PATH": "/usr/bin"})


async def test_socks5_connections_are_substituted_too(secrets, api):
    upstream, _ = api
    code, out, err = await curl(
        "--proxy", f"socks5h://127.0.0.1:{secrets.socks['sbx-a']}",
        "--cacert", str(secrets.bundle()), "-H", f"x-key: {PLACEHOLDER}",
        f"https://api.test:{upstream.port}/socks",
    )  # fmt: skip
    assert code == 0, err
    assert VALUE not in out and PLACEHOLDER.encode() in out
    assert upstream.seen.requests[-1]["headers"]["x-key"] == VALUE.decode()


async def test_upgrades_towards_a_host_with_secrets_are_refused(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        r = await c.get(
            f"https://api.test:{upstream.port}/ws",
            headers={"connection": "upgrade", "upgrade": "websocket", "x-key": PLACEHOLDER},
        )
    assert r.status_code == 501 and "upgrades" in r.text
    assert upstream.seen.requests == []


async def test_basic_credentials_are_substituted_inside(secrets, api):
    upstream, _ = api
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{upstream.port}/basic", auth=("__token__", PLACEHOLDER))
    assert r.status_code == 200
    sent = upstream.seen.requests[-1]["headers"]["authorization"]
    assert base64.b64decode(sent.removeprefix("Basic ")) == b"__token__:" + VALUE
    async with client(secrets) as c:
        r = await c.get(
            f"https://api.test:{upstream.port}/basic", auth=("__token__", OTHER_PLACEHOLDER)
        )
    assert r.status_code == 403 and "OTHER_TOKEN" in r.text  # looked into for refusals too


def test_leaves_are_cached_per_host_and_bounded(monkeypatch):
    from sandcell.network.tls import authority

    monkeypatch.setattr(authority, "MAX_LEAVES", 3)
    ca = authority.SandboxCA.mint("sbx-leaves", {"*.many.test"})
    first = ca.server_context("a.many.test")
    assert ca.server_context("a.many.test") is first  # cached
    for name in "bcd":
        ca.server_context(f"{name}.many.test")
    assert len(ca._leaves) == 3 and "a.many.test" not in ca._leaves


async def test_a_client_waiting_for_100_continue_is_not_kept_waiting(secrets, api, tmp_path):
    upstream, _ = api
    secrets.bindings["sbx-a"] = (binding(("headers", "body")),)
    body = tmp_path / "body"
    body.write_bytes(b"{" + PLACEHOLDER.encode() + b"}" + b"z" * 2_000_000)
    for framing in ([], ["-H", "transfer-encoding: chunked"]):  # read whole, and streamed
        started = asyncio.get_running_loop().time()
        code, _, err = await curl(
            "--proxy", secrets.url(), "--cacert", str(secrets.bundle()),
            "-H", "expect: 100-continue", "--expect100-timeout", "30", *framing,
            "--data-binary", f"@{body}", f"https://api.test:{upstream.port}/upload",
        )  # fmt: skip
        assert code == 0, err
        assert asyncio.get_running_loop().time() - started < 10
        assert upstream.seen.requests[-1]["body"].startswith("{" + VALUE.decode() + "}")
