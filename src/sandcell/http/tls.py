"""TLS for the router's own listener (`[server] tls_cert_file` and `tls_key_file`): the files
are checked when the configuration is read, so a server that could not speak TLS, or whose
key other users of the host could read, refuses to start instead of serving plain HTTP."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path


class ServerTLSError(ValueError):
    pass


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context of the certificate chain and its key: TLS 1.2 and later, HTTP/1.1
    by ALPN. Raises ServerTLSError naming the file and what is wrong with it."""
    try:
        mode = key_file.stat().st_mode
    except OSError as exc:
        raise ServerTLSError(f"[server] tls_key_file {key_file}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ServerTLSError(
            f"[server] tls_key_file {key_file}: readable by other users of the host "
            f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as exc:
        raise ServerTLSError(f"[server] tls_cert_file {exc.filename}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise ServerTLSError(
            f"[server] tls_cert_file {cert_file} and tls_key_file {key_file}: "
            f"not a certificate chain and its key ({getattr(exc, 'reason', None) or exc})"
        ) from None
    return context
