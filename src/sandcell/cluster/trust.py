"""The cluster's trust (SPEC §18): a cluster CA, a certificate per node and per router signed by
it, and the mutual TLS contexts a node's API and a router's client are built on.

A cluster directory holds the CA (`ca.pem`, and `ca-key.pem`, 0600, which only the machine
that issues needs) and one directory per member, `nodes/NAME/` or `routers/NAME/`, which is
what that member's host holds: `ca.pem` (the CA's certificate), `cert.pem` and `key.pem`
(0600). A member's role is in its certificate twice: as its extended key usage (a node's is
serverAuth only, a router's clientAuth only) and as a SAN URI `sandcell://ROLE/NAME`. The
usage is what OpenSSL checks during the handshake, so a node's certificate presented by a
client, or a router's by a server, fails there, before any byte of a request; beside it,
trusting only the cluster CA (not the system's) keeps out every certificate of anyone else.

Keys are P-256, as the per-sandbox CAs of `network/tls/authority`: Python's `ssl` here takes
Ed25519 certificates too, but P-256 is what every TLS stack and load balancer speaks.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import secrets
import shutil
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Role = Literal["node", "router"]
ROLES: tuple[Role, ...] = ("node", "router")
USAGE = {"node": ExtendedKeyUsageOID.SERVER_AUTH, "router": ExtendedKeyUsageOID.CLIENT_AUTH}
CA_CERT, CA_KEY, CERT, KEY = "ca.pem", "ca-key.pem", "cert.pem", "key.pem"
CA_VALIDITY = datetime.timedelta(days=3650)
MEMBER_VALIDITY = datetime.timedelta(days=365)
MAX_MEMBER_VALIDITY = datetime.timedelta(days=825)
BACKDATE = datetime.timedelta(minutes=5)  # clock skew between the issuer and the members
URI_SCHEME = "sandcell"
NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # a DNS label: a path and a URI alike
DNS_NAME = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
)


class TrustError(Exception):
    """The cluster's files are missing, unreadable, expired or not what they should be; or a
    request to make them is refused. The message names the file or the argument."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def member_dir(cluster: Path, role: Role, name: str) -> Path:
    return Path(cluster) / f"{role}s" / name


def init(cluster: Path) -> Path:
    """A new cluster CA in `cluster` (made 0700 if new); an existing CA is never replaced."""
    cluster = Path(cluster)
    for existing in (cluster / CA_KEY, cluster / CA_CERT):
        if existing.exists() or existing.is_symlink():
            raise TrustError(f"{existing} exists: this directory already holds a cluster CA")
    cluster.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = _certificate(
        _name("sandcell cluster CA"),
        key,
        key,
        (now - BACKDATE, now + CA_VALIDITY),
        [
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (_key_usage(cert_sign=True), True),
        ],
    )
    _create(cluster / CA_KEY, _key_bytes(key), 0o600)  # first: a CA never lacks its key
    _create(cluster / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cluster / CA_CERT


def issue(
    cluster: Path,
    role: Role,
    name: str,
    addresses: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    validity: datetime.timedelta = MEMBER_VALIDITY,
    now: datetime.datetime | None = None,
) -> Path:
    """A certificate for one member, signed by the cluster's CA, in its own directory (a
    re-issue replaces that directory whole); returns the directory. `now` is when its
    validity starts (tests make expired certificates with it)."""
    if role not in ROLES:
        raise TrustError(f"role must be one of {list(ROLES)}, not {role!r}")
    if not NAME.fullmatch(name):
        raise TrustError(
            f"invalid {role} name {name!r}: lower-case letters, digits and inner hyphens, "
            "at most 63 (a DNS label)"
        )
    uri = x509.UniformResourceIdentifier(f"{URI_SCHEME}://{role}/{name}")
    sans: list[x509.GeneralName] = [uri]
    sans += [_address(a) for a in addresses] + [_dns(d) for d in dns_names]
    if role == "router" and len(sans) > 1:
        raise TrustError("--address and --dns name a node: a router only dials, nobody dials it")
    if role == "node" and len(sans) == 1:
        raise TrustError("a node needs at least one --address or --dns: routers check the name")
    if not datetime.timedelta(days=1) <= validity <= MAX_MEMBER_VALIDITY:
        raise TrustError(f"validity must be 1 to {MAX_MEMBER_VALIDITY.days} days")
    ca_cert, ca_key = _load_ca(Path(cluster))
    start = (now or _now()) - BACKDATE
    if start + validity > ca_cert.not_valid_after_utc:
        raise TrustError(
            f"the cluster CA expires on {ca_cert.not_valid_after_utc:%Y-%m-%d}: a certificate "
            "cannot outlive it (shorten the validity, or make a new cluster CA)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = _certificate(
        _name(name, role),
        key,
        ca_key,
        (start, start + validity),
        [
            (x509.SubjectAlternativeName(sans), False),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(cert_sign=False), True),
            (x509.ExtendedKeyUsage([USAGE[role]]), False),
            (x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False),
        ],
        ca_cert.subject,
    )
    pem = serialization.Encoding.PEM
    return _publish(
        member_dir(cluster, role, name),
        {
            KEY: (_key_bytes(key), 0o600),
            CERT: (cert.public_bytes(pem), 0o644),
            CA_CERT: (ca_cert.public_bytes(pem), 0o644),
        },
    )


@dataclass(frozen=True)
class Member:
    """One member's files, checked: its certificate is the cluster CA's, for `role`, in date."""

    role: Role
    name: str
    directory: Path
    not_after: datetime.datetime


def load_member(directory: Path, role: Role) -> Member:
    """The member whose files are in `directory`, refused (TrustError) unless all three are
    readable, its certificate is signed by the CA beside it, in date, and for `role`."""
    directory = Path(directory)
    ca = _read_cert(directory / CA_CERT)
    cert = _read_cert(directory / CERT)
    _read(directory / KEY)  # unreadable is said here; a key not matching, by the context
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise TrustError(f"{directory / CERT} is not signed by {directory / CA_CERT}") from exc
    for path, each in ((directory / CA_CERT, ca), (directory / CERT, cert)):
        now = _now()
        if now > each.not_valid_after_utc:
            raise TrustError(f"{path} expired on {each.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if now < each.not_valid_before_utc:
            raise TrustError(f"{path} is valid only from {each.not_valid_before_utc} UTC")
    found = _roles_of(cert)
    if found != {role}:
        held = " and ".join(sorted(found)) or "no sandcell member's"
        raise TrustError(f"{directory / CERT} is a {held} certificate, not a {role}'s")
    name = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    return Member(role, str(name), directory, cert.not_valid_after_utc)


def server_context(directory: Path, role: Role = "node") -> ssl.SSLContext:
    """The TLS context of a member that answers (a node's API): it presents its certificate
    and admits only clients with a certificate of this cluster's CA for the peer role."""
    return _context(load_member(directory, role), ssl.PROTOCOL_TLS_SERVER)


def client_context(directory: Path, role: Role = "router") -> ssl.SSLContext:
    """The TLS context of a member that dials (a router): it presents its certificate and
    accepts only servers with a certificate of this cluster's CA, for the peer role and the
    name dialled."""
    return _context(load_member(directory, role), ssl.PROTOCOL_TLS_CLIENT)


def _context(member: Member, protocol: int) -> ssl.SSLContext:
    server = protocol == ssl.PROTOCOL_TLS_SERVER
    if server != (USAGE[member.role] == ExtendedKeyUsageOID.SERVER_AUTH):
        side = "answers" if server else "dials"
        raise TrustError(f"a {member.role} never {side}: its certificate cannot")
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED  # a server asks for, and requires, a certificate
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    # OpenSSL checks the peer's usage against the side (a client's must be clientAuth, a
    # server's serverAuth): with each role holding one usage, that is the role check.
    directory = member.directory
    try:
        context.load_verify_locations(cafile=directory / CA_CERT)
        context.load_cert_chain(directory / CERT, directory / KEY)
    except (ssl.SSLError, OSError) as exc:
        raise TrustError(f"{directory}: its key and certificate do not load: {exc}") from exc
    return context


def _roles_of(cert: x509.Certificate) -> set[str]:
    """The roles a certificate holds: those whose usage it has and whose URI it names."""
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    prefixes = {
        u.split("/")[2]
        for u in uris.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(f"{URI_SCHEME}://")
    }
    return {r for r in ROLES if USAGE[r] in usages and r in prefixes}


def _load_ca(cluster: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if not (cluster / CA_KEY).exists() and not (cluster / CA_CERT).exists():
        raise TrustError(f"no cluster CA in {cluster} (make one with `sandcell cluster init`)")
    cert = _read_cert(cluster / CA_CERT)
    try:
        key = serialization.load_pem_private_key(_read(cluster / CA_KEY), None)
    except (ValueError, TypeError) as exc:
        raise TrustError(f"{cluster / CA_KEY} is not an unencrypted PEM key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise TrustError(f"{cluster / CA_KEY} is not the key of {cluster / CA_CERT}")
    return cert, key


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TrustError(f"{path} is missing") from None
    except OSError as exc:
        raise TrustError(f"{path} cannot be read: {exc.strerror or exc}") from None


def _read_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_read(path))
    except ValueError:
        raise TrustError(f"{path} is not a PEM certificate") from None


def _address(text: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        raise TrustError(f"--address {text!r} is not an IP address") from None


def _dns(text: str) -> x509.GeneralName:
    if not DNS_NAME.fullmatch(text):
        raise TrustError(f"--dns {text!r} is not a host name (lower case, no wildcard)")
    return x509.DNSName(text)


def _name(common: str, unit: str | None = None) -> x509.Name:
    units = [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit)] if unit else []
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandcell"),
            *units,
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _certificate(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey,
    valid: tuple[datetime.datetime, datetime.datetime],
    extensions: list[tuple[x509.ExtensionType, bool]],
    issuer: x509.Name | None = None,
) -> x509.Certificate:
    """`key`'s certificate, signed by `signer` (itself, for the CA), with its subject key
    identifier and `extensions` (each with whether it is critical)."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _create(path: Path, data: bytes, mode: int) -> None:
    """A new file with `mode` from its first byte (whatever the umask), never an old one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def _publish(directory: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    """`files` as `directory`, whole: written into a new sibling, then swapped in, so that a
    member's key, certificate and CA are never a mix of two issues."""
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fresh = directory.with_name(f".{directory.name}.{secrets.token_hex(4)}")
    fresh.mkdir(mode=0o700)
    try:
        for name, (data, mode) in files.items():
            _create(fresh / name, data, mode)
        if directory.exists():
            retired = directory.with_name(f".{directory.name}.{secrets.token_hex(4)}")
            directory.rename(retired)
            fresh.rename(directory)
            shutil.rmtree(retired)
        else:
            fresh.rename(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(fresh)
    return directory
