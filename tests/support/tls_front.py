"""A TLS front for per-sandbox hosts, on loopback and hermetic (no DNS, no host-wide state).

E2B's SDKs reach `https://{port}-{id}.{domain}` when no sandbox URL is set. An operator puts a
wildcard certificate for `*.{domain}` in front of sandcell; this is that front for tests: an
HTTP proxy (the SDK's own `proxy=` option) that answers `CONNECT *.{domain}:443` by terminating
TLS with a throw-away CA's certificate and passing the decrypted bytes, Host header and all,
to the server. Plain requests in absolute form (`GET http://127.0.0.1:PORT/...`, the control
API) are forwarded to the server as they are. Clients trust the CA through `SSL_CERT_FILE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HEAD_LIMIT = 65_536


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_certificates(domain: str, where: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for `*.{domain}` and 127.0.0.1 it signs: (ca.pem, cert.pem,
    key.pem), the key 0600 (as `sandcell serve`'s own TLS listener requires)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("sandcell test CA"))
        .issuer_name(_name("sandcell test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(f"*.{domain}"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(f"*.{domain}"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    where.mkdir(parents=True, exist_ok=True)
    paths = (where / "ca.pem", where / "cert.pem", where / "key.pem")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    fd = os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
    return paths


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65_536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@dataclass
class TlsFront:
    url: str  # the proxy's address, for the SDK's `proxy=`
    ca: Path  # for SSL_CERT_FILE
    connects: list[str]  # the hosts CONNECTed to, in order


class _Front:
    def __init__(self, domain: str, upstream: tuple[str, int], tls: ssl.SSLContext) -> None:
        self.suffix = "." + domain
        self.upstream = upstream
        self.tls = tls
        self.connects: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        method, target, rest = head.split(b" ", 2)
        if method == b"CONNECT":
            host, _, port = target.decode().rpartition(":")
            if not host.endswith(self.suffix) or port != "443":
                writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                writer.close()
                return
            self.connects.append(host)
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self.tls)
            head = b""
        else:  # absolute form, to the server itself: forwarded in origin form
            parts = urlsplit(target.decode())
            if (parts.hostname, parts.port) != self.upstream:
                writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                writer.close()
                return
            origin = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            head = b" ".join([method, origin.encode(), rest])
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        up_writer.write(head)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


@contextlib.contextmanager
def tls_front(domain: str, server_url: str, where: Path) -> Iterator[TlsFront]:
    """The front, served from a thread of its own, for as long as the context lasts."""
    ca, cert, key = make_certificates(domain, where)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    tls.set_alpn_protocols(["http/1.1"])
    parts = urlsplit(server_url)
    front = _Front(domain, (parts.hostname or "127.0.0.1", parts.port or 80), tls)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, asyncio.AbstractServer] = {}

    async def start() -> None:
        holder["server"] = await asyncio.start_server(front.handle, "127.0.0.1", 0)
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    started.wait(10)
    port = holder["server"].sockets[0].getsockname()[1]
    try:
        yield TlsFront(f"http://127.0.0.1:{port}", ca, front.connects)
    finally:

        async def stop() -> None:
            holder["server"].close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
