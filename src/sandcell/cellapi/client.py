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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a daemon listens: a unix socket (local cells), a TCP address (pods), or a cell
    on a node, reached through its relay (`node` its API's host:port, SPEC §18). Stored in a
    sandbox's record as a plain mapping; read back through `of`."""

    uds: str | None = None
    host: str = ""
    port: int = 0
    node: str | None = None
    sandbox: str = ""

    @classmethod
    def of(cls, raw: Endpoint | Mapping[str, Any]) -> Endpoint:
        if isinstance(raw, Endpoint):
            return raw
        if "uds" in raw:
            return cls(uds=str(raw["uds"]))
        if "node" in raw:
            return cls(node=str(raw["node"]), sandbox=str(raw.get("sandbox", "")))
        try:
            return cls(host=str(raw["host"]), port=int(raw["port"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a daemon endpoint: {dict(raw)!r}") from exc

    @property
    def base_url(self) -> str:
        if self.uds is not None or self.node is not None:
            return DAEMON_BASE_URL
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"


def _transport_options(endpoint: Endpoint) -> dict[str, Any]:
    if endpoint.node is not None:
        raise ValueError("a cell on a node is reached through `dialer` only")
    if endpoint.uds is not None:
        return {"uds": endpoint.uds, "verify": _tls_context()}
    # Small request/response pairs: never wait for Nagle's algorithm.
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return {"socket_options": nodelay, "verify": _tls_context()}


def transport_for(raw: Endpoint | Mapping[str, Any]) -> tuple[httpx.HTTPTransport, str]:
    """An httpx transport and base URL for a daemon endpoint."""
    endpoint = Endpoint.of(raw)
    return httpx.HTTPTransport(**_transport_options(endpoint)), endpoint.base_url


def async_transport(
    raw: Endpoint | Mapping[str, Any],
) -> tuple[httpx.AsyncHTTPTransport, str]:
    endpoint = Endpoint.of(raw)
    return httpx.AsyncHTTPTransport(**_transport_options(endpoint)), endpoint.base_url


def dialer(raw: Endpoint | Mapping[str, Any]) -> tuple[Dial, bytes]:
    """How to open a connection to a daemon endpoint, and the Host its requests name: the
    one way every host-side client (the router's hop, its WebSockets, the health probe)
    reaches a daemon. (asyncio sets TCP_NODELAY on TCP connections itself.)"""
    endpoint = Endpoint.of(raw)
    host = endpoint.base_url.removeprefix("http://").encode()
    if endpoint.uds is not None:
        path = endpoint.uds

        async def dial(factory: Callable[[], asyncio.Protocol]) -> tuple[Any, Any]:
            return await asyncio.get_running_loop().create_unix_connection(factory, path)

        return dial, host
    if endpoint.node is not None:
        from sandcell.node.dial import node_dialer  # TLS and the cluster's files when used

        return node_dialer(endpoint.node, endpoint.sandbox), host
    address = (endpoint.host, endpoint.port)

    async def dial_tcp(factory: Callable[[], asyncio.Protocol]) -> tuple[Any, Any]:
        return await asyncio.get_running_loop().create_connection(factory, *address)

    return dial_tcp, host


class DaemonClient:
    def __init__(
        self,
        endpoint: Endpoint | Mapping[str, Any],
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
