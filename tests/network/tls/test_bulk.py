"""Bulk bodies through the substituting relay: bytes arrive as they were sent, whatever the
reads and records they came in, and an echo of the value split across two of the upstream's
writes (and across the relay's reads) still reaches the client as the placeholder."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import ssl
import time

import httpx
import pytest

from network.tls.conftest import GATED_AT, PLACEHOLDER, VALUE, echoes, noise

pytestmark = pytest.mark.anyio

MIB = 1_048_576


def client(secrets) -> httpx.AsyncClient:
    verify = ssl.create_default_context(cafile=str(secrets.bundle()))
    return httpx.AsyncClient(proxy=secrets.url(), verify=verify, timeout=30)


async def test_echoes_split_across_the_upstreams_writes_are_replaced(secrets, api_alone):
    size = 4 * MIB  # past what is read whole: streamed, re-chunked
    async with client(secrets) as c:
        r = await c.get(f"https://api.test:{api_alone.port}/echoes/{size}")
    assert r.status_code == 200
    assert VALUE not in r.content
    expected = echoes(VALUE, size).replace(VALUE, PLACEHOLDER.encode())
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(expected).digest()


async def test_an_echo_split_across_two_of_the_relays_reads_is_replaced(secrets, api_alone):
    """The upstream writes the value's first 11 bytes, then waits until the client has got
    all the relay can pass before them: so the relay has read up to the cut, and holds the
    value's start, when the rest is written."""
    size = 2 * MIB
    passable = GATED_AT + 11 - (len(VALUE) - 1)  # all but the held len(value) - 1 bytes
    got = bytearray()
    url = f"https://api.test:{api_alone.port}/gated/{size}"
    async with client(secrets) as c, c.stream("GET", url) as r:
        async for piece in r.aiter_raw():
            got += piece
            if len(got) >= passable:
                api_alone.seen.gate.set()
    assert api_alone.seen.gate.is_set()
    assert VALUE not in got
    assert got == echoes(VALUE, size, (GATED_AT,)).replace(VALUE, PLACEHOLDER.encode())


async def test_a_large_download_arrives_byte_identical(secrets, api_alone):
    size = 24 * MIB + 12_345  # not a multiple of any read or record size
    url = f"https://api.test:{api_alone.port}/random/{size}"
    async with client(secrets) as c, c.stream("GET", url) as r:
        assert r.status_code == 200
        digest, got = hashlib.sha256(), 0
        async for piece in r.aiter_raw():
            digest.update(piece)
            got += len(piece)
    assert got == size
    assert digest.digest() == hashlib.sha256(noise(size)).digest()


async def test_a_large_upload_arrives_byte_identical(secrets, api_alone):
    payload = noise(3 * MIB + 321, seed=11)

    async def pieces():
        for at in range(0, len(payload), 300_000):
            yield payload[at : at + 300_000]

    async with client(secrets) as c:
        fixed = await c.post(f"https://api.test:{api_alone.port}/up", content=payload)
        chunked = await c.post(f"https://api.test:{api_alone.port}/up", content=pieces())
    assert fixed.status_code == 200 and chunked.status_code == 200
    first, second = api_alone.seen.requests[-2:]
    assert second["headers"]["transfer-encoding"] == "chunked"
    for seen in (first, second):
        assert seen["body"].encode("latin-1") == payload


async def test_a_quiet_intercepted_connection_ends_at_the_idle_timeout(secrets, api_alone):
    """Reads wait on a timer of their own: a connection on which nothing moves is closed."""
    secrets.service.limits = dataclasses.replace(secrets.service.limits, idle_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", secrets.ports["sbx-a"])
    writer.write(f"CONNECT api.test:{api_alone.port} HTTP/1.1\r\nhost: api.test\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    trust = ssl.create_default_context(cafile=str(secrets.bundle()))
    await writer.start_tls(trust, server_hostname="api.test")
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy, not us
    assert time.monotonic() - started >= 0.4
    writer.close()
