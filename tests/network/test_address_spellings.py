"""Hole 6 of issue 26: an IPv4 address written as IPv6 (`[::ffff:a.b.c.d]`, `[::ffff:7f00:1]`)
is the same address to the kernel, so it must be to the policy, through every proxy path."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from sandcell.errors import ServiceError
from sandcell.network import socks5
from sandcell.network.policy import decide, parse_policy, within_cap

pytestmark = pytest.mark.anyio

LOOPBACK_SPELLINGS = (
    "::ffff:127.0.0.1",
    "::ffff:7f00:1",
    "::ffff:127.8.9.10",
    "0:0:0:0:0:ffff:7f00:1",
)
OTHER_INTERNAL = (
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::ffff:192.168.1.1",
    "::ffff:0.0.0.0",
)


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()


async def _socks(port: int, address: bytes, dest_port: int) -> int:
    """The reply code to a SOCKS5 CONNECT whose address part (ATYP + address) is `address`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"\x05\x01\x00")
        assert await reader.readexactly(2) == b"\x05\x00"
        writer.write(b"\x05\x01\x00" + address + struct.pack("!H", dest_port))
        return (await asyncio.wait_for(reader.readexactly(10), 5))[1]
    finally:
        writer.close()


def _socks_addresses(text: str) -> list[bytes]:
    """Both ways to name an IPv6 address: ATYP 0x04 (16 bytes) and 0x03 (its text)."""
    return [
        b"\x04" + ipaddress.IPv6Address(text).packed,
        b"\x03" + bytes([len(text)]) + text.encode(),
    ]


@pytest.fixture
async def counted_echo():
    """A loopback echo server that counts the connections it accepted."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], accepted
    server.close()


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS + OTHER_INTERNAL)
async def test_open_mode_refuses_internal_addresses_in_ipv6_spelling(
    proxies, counted_echo, spelling
):
    port, accepted = counted_echo
    proxies.set({"egress": "open"})
    target = f"[{spelling}]:{port}"
    connect = await _exchange(
        proxies.http_port, f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n".encode()
    )
    forward = await _exchange(
        proxies.http_port, f"GET http://{target}/ HTTP/1.1\r\nhost: {target}\r\n\r\n".encode()
    )
    for answer in (connect, forward):
        assert answer.startswith(b"HTTP/1.1 403"), answer
        assert b"host-internal" in answer
    for address in _socks_addresses(spelling):
        assert await _socks(proxies.socks_port, address, port) == socks5.NOT_ALLOWED
    assert accepted == []  # nothing reached the loopback server


async def test_a_refusal_names_the_address_in_its_usual_form(proxies, counted_echo):
    port, _ = counted_echo
    proxies.set({"egress": "open"})
    target = f"[::ffff:7f00:1]:{port}"
    answer = await _exchange(
        proxies.http_port, f"CONNECT {target} HTTP/1.1\r\nhost: x\r\n\r\n".encode()
    )
    assert b"resolves to 127.0.0.1," in answer


async def test_an_allow_entry_in_ipv6_spelling_reaches_what_it_names(proxies, echo):
    """Normalising both sides keeps a legitimate entry working (the kernel agrees)."""
    proxies.set({"egress": "allowlist", "allow": [f"[::ffff:127.0.0.1]:{echo}"]})
    reader, writer = await asyncio.open_connection("127.0.0.1", proxies.http_port)
    writer.write(f"CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nhost: x\r\n\r\nping".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert await reader.readexactly(4) == b"ping"
    writer.close()


@pytest.mark.parametrize(
    "entry", ["::ffff:127.0.0.1", "[::ffff:7f00:1]:6379", "::ffff:127.0.0.0/104", "::ffff:0:0/96"]
)
def test_an_internal_entry_in_ipv6_spelling_needs_network_internal(entry):
    """Before: `::ffff:127.0.0.0/104` was no "host-internal" entry, so a request whose
    template forbids internal entries could allow the host's loopback that way."""
    policy = parse_policy({"egress": "allowlist", "allow": [entry]})
    assert policy.internal_entries() == [entry]
    with pytest.raises(ServiceError) as caught:
        within_cap(policy, "open", internal_allowed=False)
    assert caught.value.code.value == "FORBIDDEN"


# The host's own, public-looking address (and a deny entry) written as IPv4-mapped IPv6, in a
# network namespace the test makes: 198.51.100.7 is this "host"'s address there, found by
# `host_addresses()` as in `sandcell serve`, and an echo server listens on it.
IN_NETNS = textwrap.dedent(
    """
    import asyncio, json, struct, subprocess
    from sandcell.network.egress import EgressService
    from sandcell.network.policy import parse_policy
    from support.sockets import listening

    OWN = "198.51.100.7"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", OWN + "/32", "dev", "lo"], check=True)

    async def attempts(port, spellings):
        out = {}
        for spelling in spellings:
            target = f"[{spelling}]:{port}"
            for kind, head in (
                ("connect", f"CONNECT {target} HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n"),
                ("forward", f"GET http://{target}/ HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n"),
            ):
                r, w = await asyncio.open_connection("127.0.0.1", proxy[0])
                w.write(head.encode())
                out[f"{kind} {spelling}"] = (await asyncio.wait_for(r.read(4096), 5)).decode()
                w.close()
            import ipaddress
            for kind, address in (
                ("socks-ipv6", b"\\x04" + ipaddress.IPv6Address(spelling).packed),
                ("socks-name", b"\\x03" + bytes([len(spelling)]) + spelling.encode()),
            ):
                r, w = await asyncio.open_connection("127.0.0.1", proxy[1])
                w.write(b"\\x05\\x01\\x00")
                await r.readexactly(2)
                w.write(b"\\x05\\x01\\x00" + address + struct.pack("!H", port))
                out[f"{kind} {spelling}"] = (await asyncio.wait_for(r.read(10), 5))[1]
                w.close()
        return out

    async def main():
        seen = []

        async def echo(r, w):
            seen.append(1)
            w.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 0\\r\\n\\r\\n")
            await w.drain()
            w.close()

        server = await asyncio.start_server(echo, OWN, 0)
        port = server.sockets[0].getsockname()[1]
        results = {}
        cases = {
            "own": ({"egress": "open"}, None),
            "deny": ({"egress": "open", "deny": [OWN]}, ()),
            "control": ({"egress": "open"}, ()),  # not known as own: reached, any spelling
        }
        for name, (raw, own) in cases.items():
            policy = parse_policy(raw)

            async def policy_for(_):
                return policy

            service = EgressService(policy_for, own_addresses=own)
            http, socks = listening(), listening()
            global proxy
            proxy = (http.getsockname()[1], socks.getsockname()[1])
            await service.serve("sbx", http, socks)
            before = len(seen)
            results[name] = {
                "own": sorted(map(str, service.own)),
                "answers": await attempts(port, ["::ffff:" + OWN, "::ffff:c633:6407"]),
                "reached": len(seen) - before,
            }
            await service.close()
        print(json.dumps(results))

    asyncio.run(main())
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of its own needs root")
def test_the_hosts_own_address_in_ipv6_spelling_is_refused():
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [tests_dir, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-c", IN_NETNS],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert "198.51.100.7" in results["own"]["own"]
    control = results["control"]
    assert control["reached"] == 8, control  # the spellings do reach the address
    for case, reason in (("own", "host-internal"), ("deny", "matches deny entry")):
        answers = results[case]["answers"]
        assert results[case]["reached"] == 0, answers
        for attempt, answer in answers.items():
            if attempt.startswith("socks"):
                assert answer == socks5.NOT_ALLOWED, attempt
            else:
                assert answer.startswith("HTTP/1.1 403") and reason in answer, (attempt, answer)


@pytest.mark.parametrize(
    "address",
    ["2002:7f00:1::", "2002:a9fe:a9fe::1", "2001:0:7f00:1::", "::127.0.0.1", "64:ff9b:1::a00:1"],
)
def test_ipv6_forms_that_carry_an_internal_ipv4_address_are_internal(address):
    """6to4 and Teredo relays send to the IPv4 address inside; the deprecated IPv4-compatible
    and local NAT64 ranges have no public meaning."""
    d = decide(parse_policy({"egress": "open"}), "x.example", 80, [address])
    assert not d.allowed and "host-internal" in d.reason


def test_6to4_of_the_hosts_own_address_is_internal():
    own = [ipaddress.ip_address("198.51.100.7")]
    d = decide(parse_policy({"egress": "open"}), "x.example", 80, ["2002:c633:6407::"], own)
    assert not d.allowed
