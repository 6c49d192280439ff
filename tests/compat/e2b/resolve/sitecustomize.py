"""Name resolution for a framework's venv, as wildcard DNS would give it: every host under
$SANDCELL_TEST_DOMAIN resolves to the sandcell listener at $SANDCELL_TEST_ADDRESS (host:port),
whatever port the client asks for. Put on PYTHONPATH, Python imports it at start; the client
packages themselves are not touched. Other names resolve as always (and reach nothing here)."""

import os
import socket

_domain = os.environ.get("SANDCELL_TEST_DOMAIN", "")
_host, _, _port = os.environ.get("SANDCELL_TEST_ADDRESS", "").rpartition(":")
_resolve = socket.getaddrinfo


def _getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = host.decode() if isinstance(host, bytes) else host
    if _domain and isinstance(name, str) and name.endswith("." + _domain):
        return _resolve(_host, int(_port), *args, **kwargs)
    return _resolve(host, port, *args, **kwargs)


if _domain and _port:
    socket.getaddrinfo = _getaddrinfo
