"""A secret-substituting egress service in this test's event loop (listeners on the host's
loopback), and HTTPS upstreams on loopback with a CA of the test's own, trusted through
`upstream_ca_file` as an operator would."""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import io
import itertools
import json
import os
import random
import ssl
import threading
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandcell.network.egress import EgressLimits, EgressService
from sandcell.network.policy import NetworkPolicy, parse_policy
from sandcell.network.tls.authority import Authorities
from sandcell.network.tls.substitution import Substitution
from sandcell.network.tls.upstream import upstream_context
from sandcell.secrets.bindings import Decision, SecretBinding
from support.sockets import listening

VALUE = b"sk-live-0123456789abcdef-the-real-value"
PLACEHOLDER = "sandcell-secret-API_TOKEN-abc123XYZ"
OTHER_VALUE = b"other-value-9876543210"
OTHER_PLACEHOLDER = "sandcell-secret-OTHER_TOKEN-def456UVW"


def binding(where: tuple[str, ...] = ("headers",), **kw: object) -> SecretBinding:
    fields: dict = {
        "name": "API_TOKEN",
        "placeholder": PLACEHOLDER,
        "value": VALUE,
        "hosts": frozenset({"api.test"}),
        "where": frozenset(where),
    }
    fields.update(kw)
    return SecretBinding(**fields)


def other_binding() -> SecretBinding:
    return SecretBinding(
        "OTHER_TOKEN",
        OTHER_PLACEHOLDER,
        OTHER_VALUE,
        frozenset({"other.test"}),
        frozenset({"headers"}),
    )


# Node's own TLS (https over a socket from an HTTP CONNECT): argv proxy-port host port value.
NODE = r"""
const http = require('http'), tls = require('tls'), https = require('https');
const [proxy, host, port, placeholder] = process.argv.slice(1);
const req = http.request({host: '127.0.0.1', port: proxy, method: 'CONNECT',
                          path: `${host}:${port}`});
req.on('connect', (res, socket) => {
  if (res.statusCode !== 200) { console.log('CONNECT', res.statusCode); process.exit(1); }
  const get = https.request({host, port, path: '/node', headers: {'x-key': placeholder},
    createConnection: () => tls.connect({socket, servername: host})}, (r) => {
    let body = ''; r.on('data', (d) => body += d);
    r.on('end', () => { console.log(r.statusCode, body); process.exit(0); });
  });
  get.on('error', (e) => { console.log('ERROR', e.code || e.message); process.exit(2); });
  get.end();
});
req.end();
"""


# -- a CA of the test's own, and certificates from it -------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@dataclass
class UpstreamCA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, cn: str = "upstream test CA") -> UpstreamCA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(_name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def server_context(self, host: str, *, expired: bool = False) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = (
            (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1))
            if expired
            else (now - datetime.timedelta(days=1), now + datetime.timedelta(days=10))
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with (
            _memfile(cert.public_bytes(serialization.Encoding.PEM)) as cert_path,
            _memfile(key_pem) as key_path,
        ):
            context.load_cert_chain(cert_path, key_path)
        return context


@contextlib.contextmanager
def _memfile(data: bytes) -> Iterator[str]:
    fd = os.memfd_create("test-cert")
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


# -- HTTPS upstreams -----------------------------------------------------------------------


@dataclass
class Seen:
    requests: list[dict] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)  # opened by a test


WHEEL_NAME = "sandpkg-1.0-py3-none-any.whl"


def wheel() -> bytes:
    """A minimal pure-Python wheel, `sandpkg` 1.0, for pip to install from the index."""
    files = {
        "sandpkg/__init__.py": b"VERSION = '1.0'\n",
        "sandpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sandpkg\nVersion: 1.0\n",
        "sandpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "sandpkg-1.0.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("sandpkg-1.0.dist-info/RECORD", record)
    return buffer.getvalue()


# Where the echoes of `echoes` start: around 256 KiB reads and the 16 KiB of a TLS record.
ECHO_OFFSETS = (0, 16_384 - 7, 262_144 - 20, 2 * 262_144 - 1, 3 * 262_144 + 5)
# Where `/echoes/` splits its writes: in the middle of each echo but the first.
ECHO_CUTS = tuple(at + 11 for at in ECHO_OFFSETS[1:])
GATED_AT = 300_000


def noise(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


def echoes(secret: bytes, size: int, offsets: tuple[int, ...] = ECHO_OFFSETS) -> bytes:
    """`size` bytes of noise with `secret` written over it at each of `offsets`."""
    data = bytearray(noise(size))
    for at in offsets:
        data[at : at + len(secret)] = secret
    return bytes(data)


def _handler(seen: Seen, index_auth: bytes | None) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _body(self) -> bytes:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                data = b""
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if not size:
                        self.rfile.readline()
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def _serve(self) -> None:
            body = self._body()
            record = {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body.decode("latin-1"),
            }
            seen.requests.append(record)
            if self.path.startswith(("/simple/", "/files/")):
                self._index()
                return
            if self.path.startswith("/split"):
                # The secret's value echoed across many small chunks (each 5 bytes).
                auth = self.headers.get("authorization", "").encode()
                payload = b"you sent: " + auth + b" and again " + auth
                self.send_response(200)
                self.send_header("transfer-encoding", "chunked")
                self.send_header("x-echo", auth.decode("latin-1"))
                self.end_headers()
                for i in range(0, len(payload), 5):
                    piece = payload[i : i + 5]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                return
            if self.path.startswith("/echoes/"):
                # Longer than what is read whole: the value at offsets around the proxy's
                # reads, each echo written in two halves (two TLS records, two segments).
                payload = echoes(VALUE, int(self.path.split("/")[2]))
                self.send_response(200)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                for start, end in itertools.pairwise([0, *ECHO_CUTS, len(payload)]):
                    self.wfile.write(payload[start:end])
                    self.wfile.flush()
                return
            if self.path.startswith("/gated/"):
                # The value at GATED_AT, its first 11 bytes written before the gate opens.
                size = int(self.path.split("/")[2])
                payload = echoes(VALUE, size, (GATED_AT,))
                self.send_response(200)
                self.send_header("content-length", str(size))
                self.end_headers()
                self.wfile.write(payload[: GATED_AT + 11])
                self.wfile.flush()
                if not seen.gate.wait(10):
                    return
                self.wfile.write(payload[GATED_AT + 11 :])
                return
            if self.path.startswith("/random/"):
                payload = noise(int(self.path.split("/")[2]))
                self.send_response(200)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if self.path.startswith("/bulk/"):
                size = int(self.path.split("/")[2])
                self.send_response(200)
                self.send_header("content-length", str(size))
                self.end_headers()
                chunk = bytes(65536)
                while size > 0:
                    self.wfile.write(chunk[: min(size, len(chunk))])
                    size -= len(chunk)
                return
            out = json.dumps(record).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def _index(self) -> None:
            """A PEP 503 index of one package, behind Basic credentials (user:token)."""
            expected = b"Basic " + base64.b64encode(index_auth or b"")
            if self.headers.get("authorization", "").encode() != expected:
                self.send_response(401)
                self.send_header("www-authenticate", 'Basic realm="index"')
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if self.path.startswith("/files/"):
                body, kind = wheel(), "application/octet-stream"
            else:
                body = f'<a href="/files/{WHEEL_NAME}">{WHEEL_NAME}</a>'.encode()
                kind = "text/html"
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class Upstream:
    def __init__(self, context: ssl.SSLContext, index_auth: bytes | None = None) -> None:
        self.seen = Seen()
        handler = _handler(self.seen, index_auth)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def test_ca() -> UpstreamCA:
    return UpstreamCA.make()


@pytest.fixture(scope="module")
def upstreams(test_ca: UpstreamCA) -> Iterator[Callable[..., Upstream]]:
    """Makes upstreams: `make("api.test")`, `make("api.test", expired=True)`, or with an
    unknown CA (`ca=`)."""
    made: list[Upstream] = []

    def make(host: str, *, expired: bool = False, ca: UpstreamCA | None = None) -> Upstream:
        upstream = Upstream((ca or test_ca).server_context(host, expired=expired))
        made.append(upstream)
        return upstream

    yield make
    for upstream in made:
        upstream.close()


# -- the proxy -----------------------------------------------------------------------------


@dataclass
class Secrets:
    """The proxy with secrets: bindings per sandbox (changed by tests), decisions recorded."""

    service: EgressService
    substitution: Substitution
    bindings: dict[str, tuple[SecretBinding, ...]]
    policies: dict[str, NetworkPolicy]
    uses: list[tuple[str, str, str, Decision]]
    ports: dict[str, int]  # sandbox id -> its HTTP proxy port
    socks: dict[str, int]
    root: Path

    def url(self, sandbox_id: str = "sbx-a") -> str:
        return f"http://127.0.0.1:{self.ports[sandbox_id]}"

    def bundle(self, sandbox_id: str = "sbx-a") -> Path:
        hosts = {h for b in self.bindings.get(sandbox_id, ()) for h in b.hosts}
        return self.substitution.authorities.trust_for(sandbox_id, hosts).bundle

    def allow(self, *ports: int, sandbox_id: str = "sbx-a") -> None:
        self.policies[sandbox_id] = parse_policy(
            {"egress": "allowlist", "allow": [f"127.0.0.1:{p}" for p in ports]}
        )


NAMES = ("api.test", "other.test", "plain.test", "wrong.test")


@pytest.fixture
async def secrets(tmp_path: Path, test_ca: UpstreamCA) -> AsyncIterator[Secrets]:
    ca_file = tmp_path / "upstream-ca.pem"
    ca_file.write_bytes(test_ca.pem())
    bindings: dict[str, tuple[SecretBinding, ...]] = {}
    policies: dict[str, NetworkPolicy] = {}
    uses: list[tuple[str, str, str, Decision]] = []

    async def bindings_for(sandbox_id: str) -> tuple[SecretBinding, ...]:
        return bindings.get(sandbox_id, ())

    async def policy_for(sandbox_id: str) -> NetworkPolicy:
        return policies.get(sandbox_id, parse_policy(None))

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host in NAMES else [host]

    substitution = Substitution(
        bindings_for,
        lambda *use: uses.append(use),
        Authorities(tmp_path / "tls"),
        upstream_context(ca_file),
    )
    service = EgressService(
        policy_for,
        resolver=resolver,
        limits=EgressLimits(max_connections=16, idle_timeout_s=10),
        substitution=substitution,
    )
    ports, socks = {}, {}
    for sandbox_id in ("sbx-a", "sbx-b"):
        http, s5 = listening(), listening()
        ports[sandbox_id], socks[sandbox_id] = http.getsockname()[1], s5.getsockname()[1]
        await service.serve(sandbox_id, http, s5)
    yield Secrets(service, substitution, bindings, policies, uses, ports, socks, tmp_path)
    await service.close()


@pytest.fixture
def api_alone(secrets: Secrets, upstreams: Callable[..., Upstream]) -> Upstream:
    """api.test, allowed, with the API_TOKEN secret naming it (and no other secret)."""
    upstream = upstreams("api.test")
    secrets.allow(upstream.port)
    secrets.bindings["sbx-a"] = (binding(),)
    return upstream
