"""A client for one daemon that signs each request with the sandbox's session key.

The manager uses it for health checks and `/init`; tests and benchmarks use it to talk to a
daemon directly. (The router proxies raw requests over `dialer`'s connections and signs them
itself with `tokens`.)
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import ssl
from collections.abc import Callable
from typing import Any

import httpx

from sandcell import tokens
from sandcell.http.upstream import Dial

DAEMON_BASE_URL = "http://sandcell-daemon"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Built once: httpx would load the CA bundle for every transport (~50 ms each), which
    dominated a warm-pool claim although daemons speak plain HTTP."""
    return ssl.create_default_context()


def _base_url(endpoint: dict[str, Any]) -> str:
    if "uds" in endpoint:
        return DAEMON_BASE_URL
    host = str(endpoint["host"])
    return f"http://{f'[{host}]' if ':' in host else host}:{endpoint['port']}"


def _transport_options(endpoint: dict[str, Any]) -> dict[str, Any]:
    if "uds" in endpoint:
        return {"uds": str(endpoint["uds"]), "verify": _tls_context()}
    # Small request/response pairs: never wait for Nagle's algorithm.
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return {"socket_options": nodelay, "verify": _tls_context()}


def transport_for(endpoint: dict[str, Any]) -> tuple[httpx.HTTPTransport, str]:
    """An httpx transport and base URL for a daemon endpoint ({"uds"} or {"host", "port"})."""
    return httpx.HTTPTransport(**_transport_options(endpoint)), _base_url(endpoint)


def async_transport(endpoint: dict[str, Any]) -> tuple[httpx.AsyncHTTPTransport, str]:
    return httpx.AsyncHTTPTransport(**_transport_options(endpoint)), _base_url(endpoint)


def dialer(endpoint: dict[str, Any]) -> tuple[Dial, bytes]:
    """How to open a connection to a daemon endpoint, and the Host its requests name.
    (asyncio sets TCP_NODELAY on TCP connections itself.)"""
    host = _base_url(endpoint).removeprefix("http://").encode()
    if "uds" in endpoint:
        path = str(endpoint["uds"])

        async def dial(factory: Callable[[], asyncio.Protocol]) -> tuple[Any, Any]:
            return await asyncio.get_running_loop().create_unix_connection(factory, path)

        return dial, host
    address = (str(endpoint["host"]), int(endpoint["port"]))

    async def dial_tcp(factory: Callable[[], asyncio.Protocol]) -> tuple[Any, Any]:
        return await asyncio.get_running_loop().create_connection(factory, *address)

    return dial_tcp, host


class DaemonClient:
    def __init__(
        self,
        endpoint: dict[str, Any],
        sandbox_id: str,
        session_key: tokens.PrivateKey | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        transport, base_url = transport_for(endpoint)
        self.http = httpx.Client(transport=transport, base_url=base_url, timeout=timeout_s)
        self.sandbox_id = sandbox_id
        self.session_key = session_key

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        response = self.http.get("/health")
        response.raise_for_status()
        return response.json()

    def init(self, bootstrap_token: str) -> httpx.Response:
        return self.http.post("/init", json={"token": bootstrap_token})

    def signed_request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        bind_body: bool = True,
    ) -> httpx.Response:
        """Sends `method path` with a fresh single-use request token bound to it."""
        if self.session_key is None:
            raise RuntimeError("no session key: the sandbox has not been initialised")
        if json_body is not None:
            content = json.dumps(json_body).encode()
        request = self.http.build_request(
            method, path, content=content, params=params, headers=headers
        )
        target = request.url.raw_path.decode("latin-1")
        body = (content or b"") if bind_body else None
        token = tokens.mint_request_token(self.session_key, self.sandbox_id, method, target, body)
        request.headers["authorization"] = f"Bearer {token}"
        if json_body is not None:
            request.headers["content-type"] = "application/json"
        return self.http.send(request)

    def exec(self, command: str | list[str], **fields: Any) -> dict[str, Any]:
        response = self.signed_request("POST", "/v1/exec", json_body={"command": command, **fields})
        response.raise_for_status()
        return response.json()
