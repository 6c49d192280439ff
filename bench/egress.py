"""Egress proxy figures: bulk throughput through CONNECT and the latency one forwarded HTTP
request adds, each beside the same transfer without the proxy.

The proxy runs in a process of its own on uvloop, as in `sandcell serve`, listening on the
host's loopback (in a cell the listeners sit in the cell's namespace; the relay is the same
code). Its policy allows the host's loopback explicitly, as a test allow-list would.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bench import egress_tls
from bench.figures import Row, row
from bench.stats import sample_ms
from sandcell.network.policy import NetworkPolicy, parse_policy

MIB = 1_048_576
POLICY = {"egress": "open", "allow": ["127.0.0.0/8"]}  # open: any port


def _source(size: int) -> tuple[socket.socket, Callable[[], None]]:
    """A server that sends `size` zero bytes on each connection, then closes it."""
    server = socket.create_server(("127.0.0.1", 0))
    chunk = bytes(MIB)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                for _ in range(size // MIB):
                    conn.sendall(chunk)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.close


def _drain(sock: socket.socket, expected: int) -> None:
    got = 0
    buffer = bytearray(MIB)
    while n := sock.recv_into(buffer):
        got += n
    if got != expected:
        raise RuntimeError(f"received {got} of {expected} bytes")


def _direct(port: int, size: int) -> Callable[[], None]:
    def run() -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            _drain(sock, size)

    return run


def _tunnelled(proxy: int, port: int, size: int) -> Callable[[], None]:
    def run() -> None:
        with socket.create_connection(("127.0.0.1", proxy)) as sock:
            sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)  # byte by byte: nothing of the body is consumed here
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            _drain(sock, size)

    return run


class _Small(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def _get(connect_to: int, target: str) -> Callable[[], None]:
    """One GET on a fresh connection (the proxy closes after each forwarded request)."""

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", connect_to, timeout=10)
        conn.request("GET", target)
        if conn.getresponse().read() != b"ok":
            raise RuntimeError("unexpected reply")
        conn.close()

    return run


@contextmanager
def _proxy() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.egress"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait()


def figures(size_mib: int, repeats: int, n: int) -> list[Row]:
    size = size_mib * MIB
    source, close_source = _source(size)
    port = source.getsockname()[1]
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Small)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    web_port = web.server_address[1]
    try:
        with _proxy() as proxy:
            copy = row(
                f"loopback copy of {size_mib} MiB, direct",
                sample_ms(_direct(port, size), repeats, warmup=1),
            )
            tunnel = row(
                f"loopback copy of {size_mib} MiB through the egress CONNECT proxy",
                sample_ms(_tunnelled(proxy, port, size), repeats, warmup=1),
                copy,
                "",
            )
            direct = sample_ms(_get(web_port, "/"), n)
            direct_get = row("HTTP GET, fresh connection, direct", direct)
            proxied_get = row(
                "HTTP GET, fresh connection, through the egress proxy",
                sample_ms(_get(proxy, f"http://127.0.0.1:{web_port}/"), n),
                direct_get,
                "",
            )
    finally:
        close_source()
        web.shutdown()
    for r in (copy, tunnel):
        r["mb_per_s"] = round(size_mib / (r["median_ms"] / 1000), 1)
    substituting = egress_tls.figures(size_mib, repeats, n)  # SPEC §17 beside its tunnel
    return [copy, tunnel, direct_get, proxied_get, *substituting]


async def _serve() -> None:
    """The proxy process: one sandbox's listeners on the host's loopback."""
    from sandcell.network.egress import EgressService

    policy = parse_policy(POLICY)

    async def policy_for(_: str) -> NetworkPolicy:
        return policy

    service = EgressService(policy_for)
    http_sock = socket.create_server(("127.0.0.1", 0))
    socks_sock = socket.create_server(("127.0.0.1", 0))
    await service.serve("sbx-bench", http_sock, socks_sock)
    print(http_sock.getsockname()[1], flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import uvloop

    uvloop.run(_serve())
