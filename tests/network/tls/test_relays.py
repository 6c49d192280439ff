"""The threads that serve intercepted connections: bounded, timed out when a side stalls, and
gone (with their descriptors) when the proxy closes; a response that begins before the
request's body is all sent still reaches the client."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import h11
import pytest

from network.tls.conftest import PLACEHOLDER, VALUE, binding

pytestmark = pytest.mark.anyio


def relay_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sandcell-tls-")]


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.02)


def sockets_open() -> set[str]:
    """This process's socket descriptors, by inode (a descriptor number can be reused)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


async def tunnel(secrets, port: int, host: str = "api.test", sandbox_id: str = "sbx-a"):
    """A CONNECT through the proxy and the cell's TLS on it: (reader, writer), or the
    proxy's answer (bytes) when it refused."""
    reader, writer = await asyncio.open_connection("127.0.0.1", secrets.ports[sandbox_id])
    writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    if not head.startswith(b"HTTP/1.1 200"):
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return head + rest
    trust = ssl.create_default_context(cafile=str(secrets.bundle(sandbox_id)))
    await writer.start_tls(trust, server_hostname=host)
    return reader, writer


async def get(reader, writer, path: str = "/") -> bytes:
    request = f"GET {path} HTTP/1.1\r\nhost: api.test\r\nx-key: {PLACEHOLDER}\r\n\r\n"
    writer.write(request.encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), 10)


async def test_past_the_bound_a_connect_is_refused_by_name(secrets, api_alone):
    secrets.substitution.relays.limit = 1
    first = await tunnel(secrets, api_alone.port)
    assert isinstance(first, tuple)
    refused = await tunnel(secrets, api_alone.port)
    assert isinstance(refused, bytes) and refused.startswith(b"HTTP/1.1 503")
    assert b"the relay to hosts with secrets holds 1 connections, its bound" in refused
    assert (await get(*first)).startswith(b"HTTP/1.1 200")  # the one held goes on
    first[1].close()
    await eventually(lambda: len(secrets.substitution.relays) == 0)
    again = await tunnel(secrets, api_alone.port)
    assert isinstance(again, tuple) and (await get(*again)).startswith(b"HTTP/1.1 200")
    again[1].close()


async def test_one_sandbox_holds_a_quarter_of_the_relays_at_most(secrets, api_alone):
    secrets.substitution.relays.limit = 8
    secrets.allow(api_alone.port, sandbox_id="sbx-b")
    secrets.bindings["sbx-b"] = (binding(),)
    held = [await tunnel(secrets, api_alone.port) for _ in range(2)]
    assert all(isinstance(h, tuple) for h in held)
    refused = await tunnel(secrets, api_alone.port)
    assert isinstance(refused, bytes) and refused.startswith(b"HTTP/1.1 503")
    assert b"this sandbox holds 2 connections to hosts with secrets" in refused
    other = await tunnel(secrets, api_alone.port, sandbox_id="sbx-b")  # another's share
    assert isinstance(other, tuple) and (await get(*other)).startswith(b"HTTP/1.1 200")
    for _, writer in [*held, other]:
        writer.close()


async def test_a_client_that_stalls_in_its_handshake_is_timed_out(secrets, api_alone):
    secrets.service.limits = dataclasses.replace(secrets.service.limits, head_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", secrets.ports["sbx-a"])
    writer.write(f"CONNECT api.test:{api_alone.port} HTTP/1.1\r\nhost: api.test\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await eventually(lambda: bool(relay_threads()))
    assert await asyncio.wait_for(reader.read(), 5) == b""  # no ClientHello: closed
    await eventually(lambda: not relay_threads())
    writer.close()


@dataclasses.dataclass
class Silent:
    """A TLS upstream that reads a request head and then, until `release`, says nothing;
    `answer` makes it answer at once instead (before any body is read)."""

    context: ssl.SSLContext
    answer: bytes = b""
    hang_up: bool = False  # closes once it has answered (unread bytes make that a reset)
    release: threading.Event = dataclasses.field(default_factory=threading.Event)
    heads: list[bytes] = dataclasses.field(default_factory=list)

    def serve(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with self.context.wrap_socket(conn, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                if not (data := tls.recv(65536)):
                    return
                head += data
            self.heads.append(head)
            if self.answer:
                tls.sendall(self.answer)
            if not self.hang_up:
                self.release.wait(10)


@pytest.fixture
def silent(secrets, test_ca) -> Iterator[Callable[[bytes], tuple[Silent, int]]]:
    started: list[tuple[Silent, socket.socket, threading.Thread]] = []

    def make(answer: bytes = b"", hang_up: bool = False) -> tuple[Silent, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        upstream = Silent(test_ca.server_context("api.test"), answer, hang_up)
        thread = threading.Thread(target=upstream.serve, args=(listener,), daemon=True)
        thread.start()
        started.append((upstream, listener, thread))
        port = listener.getsockname()[1]
        secrets.allow(port)
        secrets.bindings["sbx-a"] = (binding(),)
        return upstream, port

    yield make
    for upstream, listener, thread in started:
        upstream.release.set()
        listener.close()
        thread.join(5)


async def test_an_upstream_that_stalls_is_timed_out_and_its_thread_ends(secrets, silent):
    upstream, port = silent()
    secrets.service.limits = dataclasses.replace(secrets.service.limits, idle_timeout_s=0.5)
    reader, writer = await tunnel(secrets, port)
    writer.write(f"GET / HTTP/1.1\r\nhost: api.test\r\nx-key: {PLACEHOLDER}\r\n\r\n".encode())
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy
    assert time.monotonic() - started >= 0.4
    assert VALUE in upstream.heads[0]
    await eventually(lambda: not relay_threads())
    writer.close()


async def test_a_response_before_the_body_is_all_sent_reaches_the_client(secrets, silent):
    answer = b"HTTP/1.1 413 Too Large\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbig!"
    _, port = silent(answer)
    reader, writer = await tunnel(secrets, port)
    head = f"POST /up HTTP/1.1\r\nhost: api.test\r\nx-key: {PLACEHOLDER}\r\n"
    writer.write((head + "content-length: 50000000\r\n\r\n").encode() + bytes(100_000))
    got = await asyncio.wait_for(reader.readuntil(b"big!"), 10)
    assert got.startswith(b"HTTP/1.1 413")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the request is incomplete: closed
    writer.close()
    await eventually(lambda: not relay_threads())


async def test_a_response_then_a_hang_up_while_the_body_is_sent_reaches_the_client(secrets, silent):
    """The upstream answers and closes while the relay is still sending it the body: the
    write fails (a reset), and the response it had sent is relayed all the same."""
    answer = b"HTTP/1.1 413 Too Large\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbig!"
    _, port = silent(answer, hang_up=True)
    reader, writer = await tunnel(secrets, port)
    head = f"POST /up HTTP/1.1\r\nhost: api.test\r\nx-key: {PLACEHOLDER}\r\n"
    writer.write((head + "content-length: 50000000\r\n\r\n").encode())
    got = b""

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(200):  # 50 MB, far more than the sockets between hold
                writer.write(bytes(250_000))
                await writer.drain()

    sending = asyncio.ensure_future(send())
    try:
        got = await asyncio.wait_for(reader.readuntil(b"big!"), 10)
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()
    assert got.startswith(b"HTTP/1.1 413")
    await eventually(lambda: not relay_threads())


async def test_closing_the_proxy_ends_its_relays_threads_and_sockets(secrets, api_alone):
    before = sockets_open()
    reader, writer = await tunnel(secrets, api_alone.port)
    assert (await get(reader, writer)).startswith(b"HTTP/1.1 200")  # kept alive, idle now
    assert relay_threads()
    await secrets.service.close()
    assert not relay_threads()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the proxy's side is closed
    writer.close()
    await writer.wait_closed()
    await eventually(lambda: sockets_open() <= before)


@pytest.mark.parametrize("size", [2, 3 * 1_048_576])  # read whole by h11; read past it
async def test_bytes_past_a_responses_length_are_not_relayed(secrets, silent, size):
    """What an upstream sends beyond its response's Content-Length is no response of this
    request (nor of the next): it is dropped and the connection ends."""
    body = bytes(size)
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n".encode()
    _, port = silent(head + body + b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    reader, writer = await tunnel(secrets, port)
    writer.write(f"GET / HTTP/1.1\r\nhost: api.test\r\nx-key: {PLACEHOLDER}\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)  # to the end: the proxy closes
    writer.close()
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "api.test")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    conn.receive_data(b"")
    events = []
    while not isinstance(event := conn.next_event(), h11.ConnectionClosed):
        events.append(event)
    assert isinstance(events[0], h11.Response) and events[0].status_code == 200
    assert b"".join(e.data for e in events if isinstance(e, h11.Data)) == body
    assert isinstance(events[-1], h11.EndOfMessage)


async def test_uses_are_recorded_in_the_event_loops_thread(secrets, api_alone):
    """The recorder feeds the audit trail, whose wake-up is an asyncio.Event: a relay's
    thread hands each use to the loop, never calls it itself."""
    threads = []

    def recorder(*use):
        threads.append(threading.current_thread())
        secrets.uses.append(use)

    secrets.substitution.record_use = recorder
    reader, writer = await tunnel(secrets, api_alone.port)
    assert (await get(reader, writer)).startswith(b"HTTP/1.1 200")
    writer.close()
    await eventually(lambda: bool(threads))
    assert threads == [threading.main_thread()]
    assert secrets.uses[-1][1:] == ("API_TOKEN", "api.test", "substituted")
