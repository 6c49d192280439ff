"""The HTTP (forward and CONNECT) and SOCKS5 proxies against real servers on loopback."""

from __future__ import annotations

import asyncio
import socket
import struct

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandcell.network import socks5
from sandcell.network.egress import EgressLimits, EgressService
from sandcell.network.policy import NONE
from support.sockets import listening

pytestmark = pytest.mark.anyio


async def raw(port: int, data: bytes, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = await asyncio.wait_for(reader.read(65536) if not until_close else reader.read(-1), 5)
    writer.close()
    return out


def proxied(proxies, **kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(proxy=f"http://127.0.0.1:{proxies.http_port}", timeout=5, **kw)


async def test_nothing_passes_without_a_policy(proxies, origin):
    async with proxied(proxies) as client:
        r = await client.get(f"http://127.0.0.1:{origin}/x")
    assert r.status_code == 403
    assert "egress is 'none'" in r.text
    assert r.headers["x-sandcell-egress"] == "refused"
    reply, _, writer = await socks_connect(proxies.socks_port, "127.0.0.1", origin)
    assert reply[1] == socks5.NOT_ALLOWED
    writer.close()


async def test_forward_http_reaches_a_named_loopback_origin(proxies, origin, caplog):
    proxies.set({"egress": "allowlist", "allow": [f"127.0.0.1:{origin}"]})
    caplog.set_level("INFO", "sandcell.egress")
    async with proxied(proxies) as client:
        r = await client.get(f"http://127.0.0.1:{origin}/path?q=1")
    assert r.status_code == 200
    assert r.text == "origin saw GET /path?q=1 HTTP/1.1"
    assert "sandbox=sbx-test" in caplog.text and "decision=allowed" in caplog.text
    samples = {
        s.labels["decision"]: s.value
        for s in proxies.service.metrics.decisions.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert samples["allowed"] == 1


async def test_another_local_port_is_refused(proxies, origin, echo):
    proxies.set({"egress": "allowlist", "allow": [f"127.0.0.1:{origin}"]})
    async with proxied(proxies) as client:
        r = await client.get(f"http://127.0.0.1:{echo}/")
    assert r.status_code == 403 and "127.0.0.1, a host-internal" in r.text


async def test_open_mode_still_refuses_loopback_and_metadata(proxies, origin):
    proxies.set({"egress": "open"})
    for target in (f"127.0.0.1:{origin}", "169.254.169.254:80", "[::1]:6379"):
        head = f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n".encode()
        answer = await raw(proxies.http_port, head)
        assert answer.startswith(b"HTTP/1.1 403"), answer
        assert b"host-internal" in answer


async def test_connect_tunnel_relays_bytes_both_ways(proxies, echo):
    proxies.set({"egress": "allowlist", "allow": [f"127.0.0.1:{echo}"]})
    reader, writer = await asyncio.open_connection("127.0.0.1", proxies.http_port)
    writer.write(f"CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nhost: x\r\n\r\nearly".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert await reader.readexactly(5) == b"early"
    payload = bytes(range(256)) * 4096
    writer.write(payload)
    assert await reader.readexactly(len(payload)) == payload
    writer.close()


async def test_connect_to_a_refused_port(proxies, echo):
    proxies.set({"egress": "allowlist", "allow": ["127.0.0.1:1"]})
    answer = await raw(proxies.http_port, f"CONNECT 127.0.0.1:{echo} HTTP/1.0\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403")
    answer = await raw(proxies.http_port, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nhost: a\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502")  # allowed, but nothing listens there


async def test_a_name_that_resolves_to_a_refused_address_is_refused(proxies, origin):
    """Rebinding: the name is allowed, its address is not; the proxy connects only to what
    it checked, so a second lookup cannot change the destination."""
    proxies.names["rebind.example"] = ["127.0.0.1"]
    proxies.set({"egress": "allowlist", "allow": [f"rebind.example:{origin}"]})
    async with proxied(proxies) as client:
        r = await client.get(f"http://rebind.example:{origin}/")
    assert r.status_code == 403 and "127.0.0.1" in r.text
    reply, _, writer = await socks_connect(proxies.socks_port, "rebind.example", origin)
    assert reply[1] == socks5.NOT_ALLOWED
    writer.close()


async def test_live_policy_change_applies_to_new_connections(proxies, origin):
    async with proxied(proxies) as client:
        assert (await client.get(f"http://127.0.0.1:{origin}/")).status_code == 403
        proxies.set({"egress": "allowlist", "allow": [f"127.0.0.1:{origin}"]})
        assert (await client.get(f"http://127.0.0.1:{origin}/")).status_code == 200
        proxies.set({"egress": "none"})
        assert (await client.get(f"http://127.0.0.1:{origin}/")).status_code == 403


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET https://a/ HTTP/1.1\r\nhost: a\r\n\r\n",
        b"\x16\x03\x01garbage\r\n\r\n",
        b"CONNECT nohostport HTTP/1.1\r\n\r\n",
        b"CONNECT a:99999 HTTP/1.1\r\n\r\n",
        b"GET http://a:x/ HTTP/1.1\r\nhost: a\r\n\r\n",
    ],
)
async def test_malformed_proxy_requests_are_400(proxies, head):
    proxies.set({"egress": "open"})
    assert (await raw(proxies.http_port, head)).startswith(b"HTTP/1.1 400")


async def test_per_sandbox_connection_limit(proxies):
    idle = [await asyncio.open_connection("127.0.0.1", proxies.http_port) for _ in range(4)]
    await asyncio.sleep(0.05)
    reader, _ = await asyncio.open_connection("127.0.0.1", proxies.http_port)
    assert await asyncio.wait_for(reader.read(), 2) == b""  # closed at once
    for _, w in idle:
        w.close()


async def test_an_idle_tunnel_is_closed(proxies, echo):
    proxies.service.limits = EgressLimits(idle_timeout_s=0.3)
    proxies.set({"egress": "allowlist", "allow": [f"127.0.0.1:{echo}"]})
    reader, writer = await asyncio.open_connection("127.0.0.1", proxies.http_port)
    writer.write(f"CONNECT 127.0.0.1:{echo} HTTP/1.0\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    assert await asyncio.wait_for(reader.read(), 3) == b""  # idle past the limit: closed
    writer.close()


# -- SOCKS5 --------------------------------------------------------------------------------


async def socks_connect(port: int, host: str, dest_port: int):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    try:
        addr = b"\x01" + socket.inet_aton(host)
    except OSError:
        addr = b"\x03" + bytes([len(host)]) + host.encode()
    writer.write(b"\x05\x01\x00" + addr + struct.pack("!H", dest_port))
    reply = await reader.readexactly(10)
    return reply, reader, writer


async def test_socks5_connects_to_an_allowed_destination(proxies, echo):
    proxies.set({"egress": "allowlist", "allow": [f"127.0.0.1:{echo}"]})
    reply, reader, writer = await socks_connect(proxies.socks_port, "127.0.0.1", echo)
    assert reply[1] == socks5.SUCCEEDED
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        (b"\x05\x02\x00\x01\x00\x01\x7f\x00\x00\x01\x00\x50", socks5.CMD_NOT_SUPPORTED),
        (b"\x05\x01\x00\x09", socks5.ATYP_NOT_SUPPORTED),
        (b"\x05\x01\x00\x03\x02\xff\xfe\x00\x50", socks5.GENERAL_FAILURE),
    ],
)
async def test_socks5_bad_requests_get_their_reply_code(proxies, request_bytes, code):
    answer = await raw(proxies.socks_port, b"\x05\x01\x00" + request_bytes)
    assert answer[:2] == b"\x05\x00" and answer[2:4] == bytes((5, code))


async def test_socks5_without_no_auth_is_turned_away(proxies):
    assert await raw(proxies.socks_port, b"\x05\x01\x02") == b"\x05\xff"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.builds(lambda tail: b"\x05\x01\x00" + tail, st.binary(max_size=64)),
        st.builds(lambda tail: b"\x05\x01\x00\x05\x01\x00" + tail, st.binary(max_size=300)),
    )
)
def test_socks5_fuzz(data):
    """Any bytes: the proxy answers with a well-formed reply or closes; it never connects
    anywhere (no policy) and keeps serving."""
    asyncio.run(_fuzz_once(data))


async def _fuzz_once(data: bytes) -> None:
    async def policy_for(_: str):
        return NONE

    service = EgressService(policy_for, limits=EgressLimits(head_timeout_s=0.2))
    http, socks = listening(), listening()
    port = socks.getsockname()[1]
    await service.serve("sbx-fuzz", http, socks)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 2)
        writer.close()
        assert answer in (b"", b"\x05\xff") or answer[:2] == b"\x05\x00"
        rest = answer[2:]
        assert rest == b"" or (len(rest) == 10 and rest[1] != socks5.SUCCEEDED)
        assert service.metrics.decisions.labels("allowed")._value.get() == 0
        reply, _, w = await socks_connect(port, "127.0.0.1", 9)
        assert reply[1] == socks5.NOT_ALLOWED
        w.close()
    finally:
        await service.close()
