"""Hole 5 of issue 26: egress tunnels were bounded per sandbox only, so one key's sandboxes
together could take every descriptor of the router's process. Now a key (principal) and the
process have bounds of their own, below RLIMIT_NOFILE."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import textwrap
import time

import pytest

from sandcell.network import socks5
from sandcell.network.egress import EgressLimits, EgressService
from sandcell.network.policy import parse_policy
from support.sockets import listening

pytestmark = pytest.mark.anyio


async def tunnel(port: int, dest: int) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """A CONNECT through the HTTP proxy on `port`: (the answer's head, empty if the proxy
    closed without one, and the streams)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT 127.0.0.1:{dest} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    except (asyncio.IncompleteReadError, ConnectionResetError):
        head = b""
    return head, reader, writer


async def socks_tunnel(port: int, dest: int) -> tuple[int, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    writer.write(b"\x05\x01\x00\x01\x7f\x00\x00\x01" + dest.to_bytes(2, "big"))
    return (await asyncio.wait_for(reader.readexactly(10), 5))[1], writer


async def works(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> bool:
    writer.write(b"ping")
    return await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"


async def test_a_keys_sandboxes_share_one_bound_and_the_process_has_another(echo):
    owners = {"a1": "alice", "a2": "alice", "a3": "alice", "b1": "bob", "b2": "bob"}
    policy = parse_policy({"egress": "allowlist", "allow": [f"127.0.0.1:{echo}"]})

    async def policy_for(_: str):
        return policy

    async def owner_for(sandbox_id: str):
        return owners[sandbox_id]

    limits = EgressLimits(max_connections=4, max_connections_per_owner=6, max_connections_total=9)
    service = EgressService(policy_for, owner_for=owner_for, limits=limits)
    ports: dict[str, tuple[int, int]] = {}
    for sandbox_id in owners:
        http, socks = listening(), listening()
        ports[sandbox_id] = (http.getsockname()[1], socks.getsockname()[1])
        await service.serve(sandbox_id, http, socks)
    held: list[asyncio.StreamWriter] = []
    try:
        # Alice: four tunnels from a1 (its sandbox's bound), two from a2: her key's bound.
        for sandbox_id, count in (("a1", 4), ("a2", 2)):
            for _ in range(count):
                head, reader, writer = await tunnel(ports[sandbox_id][0], echo)
                assert head.startswith(b"HTTP/1.1 200") and await works(writer, reader)
                held.append(writer)
        assert service.held_by("alice") == 6
        # A seventh, from a sandbox well under its own bound: 429 with the reason, then EOF.
        head, reader, writer = await tunnel(ports["a2"][0], echo)
        assert head.startswith(b"HTTP/1.1 429"), head
        assert b"retry-after: 1" in head
        assert b"this key's sandboxes hold 6" in await asyncio.wait_for(reader.read(), 5)
        writer.close()
        code, writer = await socks_tunnel(ports["a3"][1], echo)
        assert code == socks5.GENERAL_FAILURE
        writer.close()
        # Bob's key is served meanwhile, until the process's bound (9) is reached.
        for sandbox_id in ("b1", "b1", "b2"):
            head, reader, writer = await tunnel(ports[sandbox_id][0], echo)
            assert head.startswith(b"HTTP/1.1 200") and await works(writer, reader)
            held.append(writer)
        assert service.held == 9
        head, reader, writer = await tunnel(ports["b2"][0], echo)
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"egress proxies hold 9 connections" in await asyncio.wait_for(reader.read(), 5)
        writer.close()
        samples = {
            s.labels["bound"]: s.value
            for s in service.metrics.limited.collect()[0].samples
            if s.name.endswith("_total")
        }
        assert samples == {"owner": 2.0, "total": 1.0}
        # One of Alice's tunnels ends: her slot comes back once the proxy has closed it.
        held.pop(0).close()
        deadline = time.monotonic() + 5
        while service.held_by("alice") != 5:
            assert time.monotonic() < deadline, "the tunnel's slot was never given back"
            await asyncio.sleep(0.01)
        head, reader, writer = await tunnel(ports["a3"][0], echo)
        assert head.startswith(b"HTTP/1.1 200") and await works(writer, reader)
        held.append(writer)
    finally:
        for writer in held:
            writer.close()
        await service.close()


def test_the_derived_bounds_sit_below_the_file_limit():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = EgressLimits()
    assert 2 * limits.total_cap() < soft - 256  # two descriptors a tunnel, a reserve kept
    assert limits.owner_cap() == limits.total_cap() // 4
    assert EgressLimits(max_connections_total=10**6).total_cap() == limits.total_cap()
    assert EgressLimits(max_connections_per_owner=5).owner_cap() == 5


# The attack as issue 26 found it, on the process's real file limit: a proxy process with
# RLIMIT_NOFILE 1024 and its default bounds serves eight sandboxes of one key and one of
# another; the test opens every tunnel the per-sandbox bound allows (8 x 64).
PROXY_HOST = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    from sandcell.network.egress import EgressService
    from sandcell.network.policy import parse_policy
    from support.sockets import listening

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    echo = int(sys.argv[1])
    owners = {f"a{i}": "alice" for i in range(8)} | {"b0": "bob"}
    policy = parse_policy({"egress": "allowlist", "allow": [f"127.0.0.1:{echo}"]})

    async def policy_for(_):
        return policy

    async def owner_for(sandbox_id):
        return owners[sandbox_id]

    async def main():
        service = EgressService(policy_for, owner_for=owner_for)
        ports = {}
        for sandbox_id in owners:
            http, socks = listening(), listening()
            ports[sandbox_id] = http.getsockname()[1]
            await service.serve(sandbox_id, http, socks)
        caps = {"total": service.limits.total_cap(), "owner": service.limits.owner_cap()}
        print(json.dumps({"ports": ports, "caps": caps}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())
    """
)


async def test_one_keys_tunnels_cannot_exhaust_the_proxys_descriptors(echo):
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [tests_dir, *filter(None, [os.environ.get("PYTHONPATH")])]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROXY_HOST,
        str(echo),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
    )
    held: list[asyncio.StreamWriter] = []
    try:
        assert proc.stdout is not None
        started = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        ports, caps = started["ports"], started["caps"]
        assert caps == {"total": 96, "owner": 24}  # (1024 - 256) / 8, a quarter of that
        began = time.monotonic()
        answers: dict[str, int] = {}
        for i in range(8):
            results = await asyncio.gather(*(tunnel(ports[f"a{i}"], echo) for _ in range(64)))
            for head, _, writer in results:
                status = head.split(b" ")[1].decode() if head else "closed"
                answers[status] = answers.get(status, 0) + 1
                (held if status == "200" else []).append(writer)
                if status != "200":
                    writer.close()
        elapsed = time.monotonic() - began
        # Past the key's bound: a 429 while few refusals are being answered, else closed.
        assert answers.pop("200") == 24 and answers.pop("429") >= 8, answers
        assert set(answers) <= {"closed"} and sum(answers.values()) <= 8 * 64 - 24 - 8
        descriptors = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert descriptors < 200, descriptors  # 24 tunnels, 18 listeners, the interpreter's
        head, reader, writer = await tunnel(ports["b0"], echo)  # another key: served
        assert head.startswith(b"HTTP/1.1 200") and await works(writer, reader)
        held.append(writer)
        assert elapsed < 30
        print(f"512 attempts in {elapsed:.2f} s, {descriptors} descriptors held")
    finally:
        for writer in held:
            writer.close()
        if proc.stdin is not None:
            proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 10)
