"""The secret-substituting proxy (SPEC §17) beside a plain CONNECT tunnel, in the same run: HTTPS
requests on a kept-alive connection after its first handshake (SPEC §16: at most +2 ms), the
first handshake's cost (a leaf is cached per host, so this is TLS twice, not certificate
minting, after the sandbox's first connection), and bulk downloads (SPEC §16: ≥ 500 MB/s).

One HTTPS upstream on loopback serves both paths with a certificate of a bench CA for two names
the proxy resolves to 127.0.0.1: `bound.test`, which a secret names (so the proxy terminates
TLS and substitutes a header), and `tunnel.test`, which none names (an untouched tunnel). The
proxy runs in a process of its own on uvloop, as in `sandcell serve`.
"""

from __future__ import annotations

import asyncio
import datetime
import http.client
import http.server
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.figures import Row, row
from bench.stats import sample_ms

MIB = 1_048_576
PLACEHOLDER = "sandcell-secret-BENCH_TOKEN-bench0123456789"
VALUE = b"bench-value-0123456789abcdef0123456789abcdef"
NAMES = ("bound.test", "tunnel.test")


def _bench_ca(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA file (for the proxy's upstream_ca_file) and the upstream's server context."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench upstream CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAMES[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "leaf.pem", "leaf.key"))
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(leaf.public_bytes(pem))
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and a small body leave at once

    def do_GET(self) -> None:
        size = int(self.path.split("/")[2]) if self.path.startswith("/bulk/") else 2
        self.send_response(200)
        self.send_header("content-length", str(size))
        self.end_headers()
        if size == 2:
            self.wfile.write(b"ok")
            return
        chunk = bytes(MIB)
        for _ in range(size // MIB):
            self.wfile.write(chunk)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _upstream(context: ssl.SSLContext) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _proxy(ca_file: Path, root: Path) -> Iterator[tuple[int, Path, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.egress_tls", str(ca_file), str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port, bundle = proc.stdout.readline().split()
        yield int(port), Path(bundle), proc.pid
    finally:
        proc.terminate()
        proc.wait()


_CONTEXTS: dict[str, ssl.SSLContext] = {}


def _connection(proxy: int, host: str, port: int, trust: str) -> http.client.HTTPSConnection:
    """A connection through the proxy; a client context per CA file, made once (loading a
    bundle of system CAs is the client's cost, not the proxy's)."""
    if trust not in _CONTEXTS:
        _CONTEXTS[trust] = ssl.create_default_context(cafile=trust)
    conn = http.client.HTTPSConnection("127.0.0.1", proxy, context=_CONTEXTS[trust], timeout=30)
    conn.set_tunnel(host, port)
    return conn


_BUFFER = memoryview(bytearray(MIB))


def _get(conn: http.client.HTTPSConnection, path: str) -> int:
    """The body's length, read into one buffer (a fresh MiB per read would be the client's
    page faults, counted against both paths)."""
    conn.request("GET", path, headers={"x-key": PLACEHOLDER})
    response = conn.getresponse()
    got = 0
    while n := response.readinto(_BUFFER):
        got += n
    if response.status != 200:
        raise RuntimeError(f"status {response.status}")
    return got


def _kept_alive(conn: http.client.HTTPSConnection) -> Callable[[], None]:
    def run() -> None:
        _get(conn, "/small")

    return run


def _first(proxy: int, host: str, port: int, trust: str) -> Callable[[], None]:
    """A fresh connection: CONNECT, both TLS handshakes, one request."""

    def run() -> None:
        conn = _connection(proxy, host, port, trust)
        _get(conn, "/small")
        conn.close()

    return run


def _bulk(proxy: int, host: str, port: int, trust: str, size: int) -> Callable[[], None]:
    def run() -> None:
        conn = _connection(proxy, host, port, trust)
        if _get(conn, f"/bulk/{size}") != size:
            raise RuntimeError("short body")
        conn.close()

    return run


def _cpu_s(pid: int) -> float:
    """A process's CPU time (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _cpu(pid: int, moved: int) -> Iterator[dict[str, float]]:
    """CPU milliseconds per MB moved, of the proxy and of the bench's own client and
    upstream (less bound to the machine's other load than a throughput)."""
    out: dict[str, float] = {}
    proxy, own = _cpu_s(pid), os.times()
    yield out
    now = os.times()
    own_s = now.user + now.system - own.user - own.system
    mb = moved / 1e6
    out["proxy_cpu_ms_per_mb"] = round((_cpu_s(pid) - proxy) * 1000 / mb, 2)
    out["bench_cpu_ms_per_mb"] = round(own_s * 1000 / mb, 2)


def figures(size_mib: int, repeats: int, n: int) -> list[Row]:
    size = size_mib * MIB
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-tls-") as tmp:
        ca_file, context = _bench_ca(Path(tmp))
        with (
            _upstream(context) as port,
            _proxy(ca_file, Path(tmp) / "tls") as (proxy, bundle, pid),
        ):
            plain, bound = str(ca_file), str(bundle)
            tunnel_conn = _connection(proxy, "tunnel.test", port, plain)
            bound_conn = _connection(proxy, "bound.test", port, bound)
            tunnel = row(
                "HTTPS GET, kept alive, through a plain CONNECT tunnel",
                sample_ms(_kept_alive(tunnel_conn), n),
            )
            substituted = row(
                "HTTPS GET, kept alive, through the substituting proxy",
                sample_ms(_kept_alive(bound_conn), n),
                tunnel,
                "≤ +2 ms",
            )
            tunnel_conn.close()
            bound_conn.close()
            first_tunnel = row(
                "HTTPS first request (connect + handshake), plain tunnel",
                sample_ms(_first(proxy, "tunnel.test", port, plain), max(10, n // 10), 3),
            )
            first_bound = row(
                "HTTPS first request (connect + handshakes), substituting",
                sample_ms(_first(proxy, "bound.test", port, bound), max(10, n // 10), 3),
                first_tunnel,
                "",
            )
            with _cpu(pid, size * (repeats + 1)) as tunnel_cpu:
                bulk_tunnel = row(
                    f"HTTPS download of {size_mib} MiB, plain tunnel",
                    sample_ms(_bulk(proxy, "tunnel.test", port, plain, size), repeats, 1),
                )
            with _cpu(pid, size * (repeats + 1)) as bound_cpu:
                bulk_bound = row(
                    f"HTTPS download of {size_mib} MiB, substituting",
                    sample_ms(_bulk(proxy, "bound.test", port, bound, size), repeats, 1),
                    bulk_tunnel,
                    "≥ 500 MB/s",
                )
    for r, cpu in ((bulk_tunnel, tunnel_cpu), (bulk_bound, bound_cpu)):
        r["mb_per_s"] = round(size_mib * MIB / 1e6 / (float(r["median_ms"]) / 1000), 1)
        r.update(cpu)
    return [tunnel, substituted, first_tunnel, first_bound, bulk_tunnel, bulk_bound]


async def _serve(ca_file: Path, root: Path) -> None:
    """The proxy process: one sandbox whose secret names bound.test."""
    from sandcell.network.egress import EgressService
    from sandcell.network.policy import NetworkPolicy, parse_policy
    from sandcell.network.tls.authority import Authorities
    from sandcell.network.tls.substitution import Substitution
    from sandcell.network.tls.upstream import upstream_context
    from sandcell.secrets.bindings import SecretBinding

    policy = parse_policy({"egress": "open", "allow": ["127.0.0.0/8"]})
    bindings = (
        SecretBinding(
            "BENCH_TOKEN", PLACEHOLDER, VALUE, frozenset({NAMES[0]}), frozenset({"headers"})
        ),
    )

    async def policy_for(_: str) -> NetworkPolicy:
        return policy

    async def bindings_for(_: str) -> tuple[SecretBinding, ...]:
        return bindings

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    authorities = Authorities(root)
    substitution = Substitution(
        bindings_for, lambda *_: None, authorities, upstream_context(ca_file)
    )
    service = EgressService(policy_for, resolver=resolver, substitution=substitution)
    http_sock = socket.create_server(("127.0.0.1", 0))
    socks_sock = socket.create_server(("127.0.0.1", 0))
    await service.serve("sbx-bench", http_sock, socks_sock)
    bundle = authorities.trust_for("sbx-bench", {NAMES[0]}).bundle
    print(http_sock.getsockname()[1], bundle, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import uvloop

    uvloop.run(_serve(Path(sys.argv[1]), Path(sys.argv[2])))
