"""The proxy's own TLS connection to the real server: verified against the host's CA store plus
the operator's `[server] upstream_ca_file` (SNI, host name, expiry: OpenSSL's checks, on)."""

from __future__ import annotations

import ssl
from pathlib import Path

from cryptography import x509


class UpstreamCAError(ValueError):
    """`upstream_ca_file` is missing or holds no PEM certificate."""


def check_ca_file(path: Path) -> Path:
    """The file, if it exists and parses as PEM certificates; else an error naming it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UpstreamCAError(
            f"[server] upstream_ca_file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None
    try:
        x509.load_pem_x509_certificates(data)  # at least one, or ValueError
    except ValueError as exc:
        raise UpstreamCAError(
            f"[server] upstream_ca_file {str(path)!r} is not PEM certificates: {exc}"
        ) from None
    return path


def upstream_context(extra_ca_file: Path | None = None) -> ssl.SSLContext:
    """A client context as strict as the host's defaults (hostname checked, certificate
    required, TLS 1.2 or later), trusting the system store and `extra_ca_file`."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if extra_ca_file is not None:
        context.load_verify_locations(cafile=str(check_ca_file(extra_ca_file)))
    context.set_alpn_protocols(["http/1.1"])
    return context
