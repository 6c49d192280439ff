"""A certificate authority per sandbox, and the leaf certificates it signs for the hosts the
sandbox's secrets name.

The CA's private key never enters the cell: it lives in this process's memory and in a 0600
file under the data dir (so a restarted server keeps the CA its cells trust), beside, never
inside, the one directory a cell binds. A leaf's key is never written anywhere: it reaches
OpenSSL through a memfd (Python's `ssl` loads keys from paths only). A CA minted with the
hosts of its sandbox's secrets is name-constrained to them, so even its leaked key could vouch
for nothing else; the cell trusts it through a read-only bundle (the system CAs plus this CA) that
`CellTrust` names and the environment variables of SPEC §17 point to.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sandcell.isolation.staging import CELL_CA_DIR

CA_VALIDITY = datetime.timedelta(days=30)  # a sandbox's longest life, with room
LEAF_VALIDITY = datetime.timedelta(days=2)
LEAF_RENEW_BEFORE = datetime.timedelta(hours=6)  # a cached leaf this close to expiry is re-made
MAX_LEAVES = 256  # per sandbox, the oldest made dropped first
BACKDATE = datetime.timedelta(minutes=5)  # clock skew between the host and a client
SYSTEM_CA_FILE = Path("/etc/ssl/certs/ca-certificates.crt")
BUNDLE = "ca-bundle.pem"
CELL_CA_BUNDLE = f"{CELL_CA_DIR}/{BUNDLE}"  # the bundle as the cell sees it
CA_ENV_NAMES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _constraint(host: str) -> x509.GeneralName:
    """A permitted subtree: an address as a /32 (/128) network, a name as itself (its
    subdomains too, which `*.` patterns need)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return x509.DNSName(host.removeprefix("*."))
    return x509.IPAddress(ipaddress.ip_network(address))


@dataclass
class SandboxCA:
    """One sandbox's CA: its certificate is public, its key never leaves this object."""

    sandbox_id: str
    hosts: frozenset[str]  # what its name constraints permit; empty: unconstrained
    _key: ec.EllipticCurvePrivateKey = field(repr=False)
    cert: x509.Certificate
    _leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = field(
        default_factory=dict, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def mint(cls, sandbox_id: str, hosts: Iterable[str] = ()) -> SandboxCA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandcell"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"sandcell sandbox {sandbox_id}"),
            ]
        )
        now = _now()
        hosts = frozenset(hosts)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        )
        if hosts:
            permitted = [_constraint(h) for h in sorted(hosts)]
            builder = builder.add_extension(
                x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None),
                critical=True,
            )
        cert = builder.sign(key, hashes.SHA256())
        return cls(sandbox_id, hosts, key, cert)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for `host` (cached until near its expiry),
        speaking HTTP/1.1 only: the relay parses HTTP/1.1, so ALPN offers nothing else."""
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached[1] - _now() > LEAF_RENEW_BEFORE:
                return cached[0]
            context, expires = self._leaf_context(host)
            self._leaves.pop(host, None)
            while len(self._leaves) >= MAX_LEAVES:  # `*.` secrets name hosts without end
                del self._leaves[next(iter(self._leaves))]
            self._leaves[host] = (context, expires)
            return context

    def leaf(self, host: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A new leaf certificate for `host` and its key, signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        expires = min(now + LEAF_VALIDITY, self.cert.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(expires)
            .add_extension(x509.SubjectAlternativeName([_general_name(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert, key

    def _leaf_context(self, host: str) -> tuple[ssl.SSLContext, datetime.datetime]:
        cert, key = self.leaf(host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem
        secret = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with (
            _memfile("sandcell-leaf-chain", chain) as chain_path,
            _memfile("sandcell-leaf-key", secret) as key_path,
        ):
            context.load_cert_chain(chain_path, key_path)
        return context, cert.not_valid_after_utc


@contextlib.contextmanager
def _memfile(name: str, data: bytes) -> Iterator[str]:
    """`data` as a path only this process can open (a memfd), for APIs that take paths."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


@dataclass(frozen=True)
class CellTrust:
    """What a cell needs to trust its sandbox's CA: the bundle on the host (read-only, to be
    bound at `CELL_CA_BUNDLE`) and the variables that point its clients there."""

    bundle: Path
    env: dict[str, str]

    @property
    def directory(self) -> Path:
        """What the cell binds read-only (overlays stage directories, not files)."""
        return self.bundle.parent


class Authorities:
    """The CAs of this process's sandboxes, minted on first use. Under `root` (the data dir's,
    0700, outside every cell), one directory per sandbox: its CA's key (0600) and certificate,
    so that a restarted server keeps the CA its cells already trust, and `cell/`, the one
    directory a cell binds (read-only), holding only the bundle (0444)."""

    def __init__(self, root: Path | None = None, system_cas: Path = SYSTEM_CA_FILE) -> None:
        self.root = root
        self.system_cas = system_cas
        self._cas: dict[str, SandboxCA] = {}
        self._lock = threading.Lock()

    def of(self, sandbox_id: str, hosts: Iterable[str] = ()) -> SandboxCA:
        """The sandbox's CA: known, kept from before a restart, or new (`hosts` constrains
        a new one; a known one stays as minted)."""
        with self._lock:
            ca = self._cas.get(sandbox_id) or self._load(sandbox_id)
            if ca is None:
                ca = SandboxCA.mint(sandbox_id, hosts)
                self._keep(ca)
            self._cas[sandbox_id] = ca
            return ca

    def known(self, sandbox_id: str) -> SandboxCA | None:
        return self._cas.get(sandbox_id)

    def _directory(self, sandbox_id: str) -> Path | None:
        if self.root is None:
            return None
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
            raise ValueError(f"invalid sandbox id {sandbox_id!r}")
        return self.root / sandbox_id

    def _keep(self, ca: SandboxCA) -> None:
        directory = self._directory(ca.sandbox_id)
        if directory is None:
            return
        directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.mkdir(exist_ok=True, mode=0o700)
        key = ca._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write(directory / "ca-key.pem", key, 0o600)
        _write(directory / "ca.pem", ca.cert_pem, 0o644)

    def _load(self, sandbox_id: str) -> SandboxCA | None:
        directory = self._directory(sandbox_id)
        if directory is None:
            return None
        try:
            key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), None)
            cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.not_valid_after_utc < _now():
            return None
        try:
            constraints = cert.extensions.get_extension_for_class(x509.NameConstraints).value
            hosts = frozenset(str(n.value) for n in constraints.permitted_subtrees or ())
        except x509.ExtensionNotFound:
            hosts = frozenset()
        return SandboxCA(sandbox_id, hosts, key, cert)

    def trust_for(self, sandbox_id: str, hosts: Iterable[str]) -> CellTrust:
        """The sandbox's CA (minted for `hosts` if new) and its bundle, written for the cell;
        what the create path of a sandbox with secrets calls before the cell starts."""
        ca = self.of(sandbox_id, hosts)
        directory = self._directory(sandbox_id)
        if directory is None:
            raise RuntimeError("no directory for CA bundles was configured")
        cell = directory / "cell"
        cell.mkdir(exist_ok=True, mode=0o755)
        system = self.system_cas.read_bytes() if self.system_cas.exists() else b""
        bundle = cell / BUNDLE
        _write(bundle, system.rstrip(b"\n") + b"\n" + ca.cert_pem, 0o444)
        return CellTrust(bundle, {name: CELL_CA_BUNDLE for name in CA_ENV_NAMES})

    def forget(self, sandbox_id: str) -> None:
        """A deleted sandbox: its CA goes, key and bundle included."""
        with self._lock:
            self._cas.pop(sandbox_id, None)
        directory = self._directory(sandbox_id)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _write(path: Path, data: bytes, mode: int) -> None:
    """`data` at `path` with `mode` from its first byte, replaced atomically."""
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(partial, mode)  # whatever the umask took away
    os.replace(partial, path)
