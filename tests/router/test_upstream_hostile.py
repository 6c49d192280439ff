"""The router's client for the daemon hop against daemons that misbehave, for real: fake
daemons on unix sockets that answer garbage, trickle, fall silent, flood headers, die
mid-answer or speak out of turn. The daemon runs inside the sandbox, so each of these is
what sandboxed code that took over its daemon could do to the router."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from sandcell import tokens
from sandcell.cellapi import limits as cell_limits
from sandcell.cellapi.client import dialer
from sandcell.http import upstream
from sandcell.router.core import Hop
from sandcell.store import SandboxRecord
from support.proxying import forwarding_app, proxy_client, sandbox_record, served, stored

SANDBOX_ID = "sbx-hostile"
EXEC = f"/v1/sandboxes/{SANDBOX_ID}/exec"
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class FakeDaemon:
    """Counts the connections it accepted and those that the router closed."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.closed_by_peer = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await self.handler(reader, writer)
            while await reader.read(65536):  # until the router closes its side
                pass
            self.closed_by_peer += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_peer += 1
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


@contextlib.asynccontextmanager
async def daemon_endpoint(
    tmp_path: Path, fake: FakeDaemon, tcp: bool
) -> AsyncIterator[dict[str, object]]:
    if tcp:
        server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
        endpoint: dict[str, object] = {
            "host": "127.0.0.1",
            "port": server.sockets[0].getsockname()[1],
        }
    else:
        server = await asyncio.start_unix_server(fake.serve, str(tmp_path / "d.sock"))
        endpoint = {"uds": str(tmp_path / "d.sock")}
    try:
        yield endpoint
    finally:
        server.close()
        (tmp_path / "d.sock").unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def served_client(
    proxy: Hop, record: SandboxRecord, front: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the forwarding app served by uvicorn: streams, disconnects, backpressure."""
    transport = httpx.AsyncHTTPTransport(uds=str(front))
    async with (
        served(forwarding_app(proxy, record), front),
        httpx.AsyncClient(transport=transport, base_url="http://router") as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def hop(
    tmp_path: Path, handler: Handler, *, tcp: bool = False, served_router: bool = False
) -> AsyncIterator[tuple[FakeDaemon, httpx.AsyncClient]]:
    """(the fake daemon, a client of a router-like app forwarding to it), the app called
    in-process or, with `served_router`, over a socket."""
    fake = FakeDaemon(handler)
    async with daemon_endpoint(tmp_path, fake, tcp) as endpoint:
        record = sandbox_record(SANDBOX_ID, endpoint)
        async with stored(tmp_path, record, tokens.generate_p256()) as store:
            proxy = Hop(store)
            front = served_client(proxy, record, tmp_path / "router.sock")
            async with front if served_router else proxy_client(proxy, record) as client:
                yield fake, client
            await proxy.close()


def assert_error(reply: object, status: int, code: str) -> None:
    assert reply.status_code == status, reply.text  # type: ignore[attr-defined]
    assert reply.json()["error"]["code"] == code  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_garbage_is_502_and_the_connection_is_dropped(tmp_path: Path) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\nnot http at all")

    async with hop(tmp_path, garbage) as (fake, client):
        assert_error(await client.post(EXEC, json={"command": "true"}), 502, "SANDBOX_UNREACHABLE")
        assert_error(await client.post(EXEC, json={"command": "true"}), 502, "SANDBOX_UNREACHABLE")
        await asyncio.sleep(0.05)
    assert fake.accepted == 2 and fake.closed_by_peer == 2  # never reused


@pytest.mark.anyio
@pytest.mark.parametrize("shape", ["many headers", "one endless header"])
async def test_a_huge_head_is_refused_once_past_the_bound(tmp_path: Path, shape: str) -> None:
    sent = 0

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n" + (b"x-pad: " if shape != "many headers" else b""))
        line = b"x-pad: " + b"a" * 1000 + b"\r\n" if shape == "many headers" else b"a" * 1000
        for _ in range(100_000):  # 100 MB, if nobody stopped it
            writer.write(line)
            sent += len(line)
            await writer.drain()

    async with hop(tmp_path, flood) as (_, client):
        reply = await client.post(EXEC, json={"command": "true"})
    assert_error(reply, 502, "SANDBOX_UNREACHABLE")
    # Read no further than the bound plus what the socket buffers held.
    assert sent < 16 * upstream.MAX_HEAD_BYTES, sent


@pytest.mark.anyio
async def test_a_head_past_the_bound_is_refused_even_in_one_piece(tmp_path: Path) -> None:
    """A whole oversized head (and its body) in one write: no partial line to count."""
    pad = b"x-pad: " + b"a" * 1000 + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\n" + pad * (upstream.MAX_HEAD_BYTES // len(pad) + 2)

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head + b"content-length: 2\r\n\r\n{}")

    async with hop(tmp_path, big) as (_, client):
        assert_error(await client.post(EXEC, json={"command": "true"}), 502, "SANDBOX_UNREACHABLE")


@pytest.mark.anyio
@pytest.mark.parametrize("shape", ["silent", "trickling"])
async def test_a_slow_daemon_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    monkeypatch.setattr(cell_limits, "ANSWER_MARGIN_S", 0.5)

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for byte in b"HTTP/1.1 200 OK\r\n" + b"x-a: b\r\n" * 1000:
            if shape == "trickling":  # a byte at a time, each well within the timeout
                writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    async with hop(tmp_path, slow) as (_, client):
        started = time.monotonic()
        reply = await client.post(EXEC, json={"command": "true", "timeout_s": 0})
        elapsed = time.monotonic() - started
    assert_error(reply, 504, "SANDBOX_TIMEOUT")
    assert 0.4 < elapsed < 3, elapsed


@pytest.mark.anyio
async def test_a_daemon_dying_mid_answer(tmp_path: Path) -> None:
    """A short answer cut early is a 502; a streamed one ends truncated, never hangs."""

    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b"/v1/exec " in head:
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"exit')
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        writer.transport.abort()

    async with hop(tmp_path, dies) as (_, client):
        assert_error(await client.post(EXEC, json={"command": "true"}), 502, "SANDBOX_UNREACHABLE")
        async with asyncio.timeout(5):
            reply = await client.get(f"/v1/sandboxes/{SANDBOX_ID}/processes/1/output")
    assert reply.status_code == 200 and reply.content == b"first"


@pytest.mark.anyio
async def test_a_client_leaving_a_stream_closes_the_daemons_connection(tmp_path: Path) -> None:
    """Following a process's output waits without a timeout; when the user goes away, the
    router stops reading the daemon's stream and closes that connection."""

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"6\r\nline\n\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)

    async with hop(tmp_path, endless, served_router=True) as (fake, client):
        url = f"/v1/sandboxes/{SANDBOX_ID}/processes/1/output"
        async with client.stream("GET", url) as reply:
            async for chunk in reply.aiter_raw():
                assert chunk.startswith(b"line")
                break
        async with asyncio.timeout(5):
            while not fake.closed_by_peer:
                await asyncio.sleep(0.02)


@pytest.mark.anyio
async def test_a_flood_of_body_waits_for_a_slow_reader(tmp_path: Path) -> None:
    """A daemon cannot make the router hold its answer in memory: while the user does not
    read, the router stops reading the daemon, whose writes then block."""
    sent = 0

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (256 << 20))
        block = b"x" * (1 << 20)
        for _ in range(256):
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async with (
        hop(tmp_path, flood, served_router=True) as (_, client),
        client.stream("GET", f"/v1/sandboxes/{SANDBOX_ID}/files") as reply,
    ):
        chunks = reply.aiter_raw()  # held: a dropped iterator would close the stream
        await chunks.__anext__()
        await asyncio.sleep(0.5)  # the user reads nothing meanwhile
        assert 0 < sent < 32 << 20, sent


@pytest.mark.anyio
async def test_a_short_answer_written_slowly_is_relayed_as_it_comes(tmp_path: Path) -> None:
    """Short answers are sent on whole, but one that is slow to complete (a user's server
    behind a port, say) is not held back for long: its first bytes go on after the grace."""

    async def slow_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")
        await asyncio.sleep(2)
        writer.write(b"world")

    async with hop(tmp_path, slow_body, served_router=True) as (_, client):
        started = time.monotonic()
        async with client.stream("GET", f"/v1/sandboxes/{SANDBOX_ID}/ports/8000/") as reply:
            chunks = reply.aiter_raw()
            assert await chunks.__anext__() == b"hello"
            assert time.monotonic() - started < 1.5
            assert await chunks.__anext__() == b"world"


@pytest.mark.anyio
async def test_bytes_out_of_turn_retire_the_connection(tmp_path: Path) -> None:
    """A daemon writing between answers loses that connection; the next request is sent on
    a fresh one, and answered."""

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await asyncio.sleep(0.05)
        writer.write(OK)  # a second answer nobody asked for

    async with hop(tmp_path, chatty) as (fake, client):
        assert (await client.post(EXEC, json={"command": "true"})).json() == {}
        await asyncio.sleep(0.2)
        assert fake.closed_by_peer == 1
        assert (await client.post(EXEC, json={"command": "true"})).json() == {}
    assert fake.accepted == 2


@pytest.mark.anyio
async def test_pool_keeps_few_idle_connections_and_not_for_long(tmp_path: Path) -> None:
    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)

    fake = FakeDaemon(answers)
    uds = tmp_path / "d.sock"
    server = await asyncio.start_unix_server(fake.serve, str(uds))
    dial, host = dialer({"uds": str(uds)})
    pool = upstream.Pool(dial, max_idle=2, idle_s=0.3)
    head = upstream.request_head("GET", b"/health", host, [])

    async def exchange() -> upstream.Connection:
        conn = await pool.acquire(2)
        conn.send(head)
        await conn.response_head(2)
        await conn.whole_if_within(1024, 2)
        assert conn.complete
        assert conn.body() == b"{}"
        return conn

    try:
        for conn in await asyncio.gather(*(exchange() for _ in range(3))):
            pool.release(conn)
        await asyncio.sleep(0.1)
        assert (fake.accepted, fake.closed_by_peer) == (3, 1)  # two kept, one closed
        pool.release(await exchange())  # reuses a kept one
        assert fake.accepted == 3
        await asyncio.sleep(0.6)
        assert fake.closed_by_peer == 3  # the idle ones closed themselves
    finally:
        pool.close()
        server.close()
        uds.unlink(missing_ok=True)


@pytest.mark.anyio
async def test_a_daemon_on_tcp_is_reached_the_same_way(tmp_path: Path) -> None:
    """Pods listen on TCP: same client, with the address as the Host."""
    heads: list[bytes] = []

    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await read_request(reader))
        writer.write(OK)

    async with hop(tmp_path, answers, tcp=True) as (_, client):
        reply = await client.post(EXEC, json={"command": "true"})
    assert reply.status_code == 200 and reply.json() == {}
    assert heads[0].startswith(b"POST /v1/exec HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"\r\nauthorization: Bearer " in heads[0]


def test_a_request_head_cannot_be_split() -> None:
    """Values that reach the head from callers (a façade's headers, a target) cannot add a
    header or a request of their own."""
    for name, value in [
        (b"x-a", b"1\r\nauthorization: Bearer forged"),
        (b"x-a\r\nx-b", b"1"),
        (b"x-a", b"1\nx-b: 2"),
    ]:
        with pytest.raises(ValueError):
            upstream.request_head("GET", b"/v1/files", b"d", [(name, value)])
    with pytest.raises(ValueError):
        upstream.request_head("GET", b"/v1/files HTTP/1.1\r\nx-a: b", b"d", [])
