"""The egress service: one HTTP and one SOCKS5 listener per sandbox, run by the host's event loop.

The listening sockets live in the cell's network namespace (see `bridge`), but every accepted
connection is served here, outside the cell: the policy is looked up per connection (so a live
change applies to new connections), the name is resolved here, and the upstream connection goes
only to an address that passed the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.network.metrics import EgressMetrics
from sandcell.network.policy import NONE, Decision, IPAddress, NetworkPolicy, decide, parse_policy
from sandcell.network.pumps import both_ways

if TYPE_CHECKING:
    from sandcell.store import Store

log = logging.getLogger("sandcell.egress")

CHUNK = 65_536  # also the stream buffer limit: at most a few chunks are held per connection
PolicyLookup = Callable[[str], Awaitable[NetworkPolicy]]
Resolver = Callable[[str, int], Awaitable[list[str]]]
Handler = Callable[
    ["EgressService", str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]


@dataclass(frozen=True)
class EgressLimits:
    max_connections: int = 64  # per sandbox, both proxies together
    idle_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    head_timeout_s: float = 10.0  # a client must send its request (or SOCKS greeting) by then


class Refused(Exception):
    """An allowed destination that cannot be reached; `reason` is shown to the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def system_resolver(host: str, port: int) -> list[str]:
    """Addresses of `host` from the host's resolver (in order, without repeats)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [host]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def host_addresses() -> frozenset[IPAddress]:
    """This host's own addresses (a public one too: the router may listen on it)."""
    found: set[IPAddress] = set()
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line and "|--" in previous:
                found.add(ipaddress.ip_address(previous.split("|--")[1].strip()))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(ipaddress.ip_address(":".join(raw[i : i + 4] for i in range(0, 32, 4))))
    return frozenset(found)


def policy_from_store(store: Store) -> PolicyLookup:
    """The policy stored with the sandbox, read per connection: a change made through any
    replica applies to the next connection; a sandbox being deleted (or a pool cell no one
    has claimed) gets none."""

    async def lookup(sandbox_id: str) -> NetworkPolicy:
        record = await store.get_sandbox(sandbox_id)
        if record is None or record.state != "running" or not record.network:
            return NONE
        return parse_policy(record.network)

    return lookup


@dataclass
class _Sandbox:
    servers: list[asyncio.AbstractServer] = field(default_factory=list)
    connections: int = 0


class EgressService:
    def __init__(
        self,
        policy_for: PolicyLookup,
        *,
        resolver: Resolver = system_resolver,
        limits: EgressLimits | None = None,
        own_addresses: Iterable[IPAddress] | None = None,
    ) -> None:
        self.policy_for = policy_for
        self.resolver = resolver
        self.limits = limits or EgressLimits()
        self.own = frozenset(host_addresses() if own_addresses is None else own_addresses)
        self.metrics = EgressMetrics()
        self._sandboxes: dict[str, _Sandbox] = {}

    # -- listeners ------------------------------------------------------------------------

    async def serve(self, sandbox_id: str, http: socket.socket, socks: socket.socket) -> None:
        """Starts serving a sandbox's two listening sockets (already bound and listening)."""
        from sandcell.network import http_proxy, socks5  # the handlers import this module

        await self.detach(sandbox_id)
        entry = self._sandboxes[sandbox_id] = _Sandbox()
        for sock, handler in ((http, http_proxy.handle), (socks, socks5.handle)):
            sock.setblocking(False)
            server = await asyncio.start_server(
                self._guarded(sandbox_id, handler), sock=sock, limit=CHUNK
            )
            entry.servers.append(server)

    async def detach(self, sandbox_id: str) -> None:
        entry = self._sandboxes.pop(sandbox_id, None)
        for server in entry.servers if entry else []:
            server.close()

    async def close(self) -> None:
        for sandbox_id in list(self._sandboxes):
            await self.detach(sandbox_id)

    @property
    def served(self) -> frozenset[str]:
        """The sandboxes whose listeners are open."""
        return frozenset(self._sandboxes)

    def _guarded(
        self, sandbox_id: str, handler: Handler
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        """Counts the sandbox's connections, refuses past the limit, always closes."""

        async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            entry = self._sandboxes.get(sandbox_id)
            if entry is None or entry.connections >= self.limits.max_connections:
                self.metrics.decisions.labels("refused").inc()
                log.warning("egress sandbox=%s decision=refused reason=too many", sandbox_id)
                writer.close()
                return
            entry.connections += 1
            try:
                await handler(self, sandbox_id, reader, writer)
            except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
                pass  # the client went away or stalled: nothing to answer
            except Exception:
                # A store outage while looking up the policy, say: this connection ends
                # (closed, so nothing passes), the proxy goes on serving.
                log.exception("egress sandbox=%s: connection failed", sandbox_id)
            finally:
                entry.connections -= 1
                writer.close()

        return serve_one

    # -- decisions and upstreams ----------------------------------------------------------

    async def authorize(self, sandbox_id: str, proto: str, host: str, port: int) -> Decision:
        """Resolves `host`, applies the sandbox's current policy, logs and counts."""
        policy = await self.policy_for(sandbox_id)
        addresses: list[str] = []
        if policy.egress != "none":
            try:
                addresses = await self.resolver(host, port)
            except (OSError, UnicodeError) as exc:
                decision = Decision(False, f"{host} did not resolve: {exc}")
                return self._record(sandbox_id, proto, host, port, decision)
        decision = decide(policy, host, port, addresses, self.own)
        return self._record(sandbox_id, proto, host, port, decision)

    def _record(
        self, sandbox_id: str, proto: str, host: str, port: int, decision: Decision
    ) -> Decision:
        verdict = "allowed" if decision.allowed else "refused"
        self.metrics.decisions.labels(verdict).inc()
        log.info(
            "egress sandbox=%s proto=%s dest=%r port=%d decision=%s reason=%s",
            sandbox_id,
            proto,
            host,
            port,
            verdict,
            decision.reason,
        )
        return decision

    async def connect(
        self, decision: Decision, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the first checked address that answers (never a re-resolved name)."""
        last = "no address"
        for address in decision.addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=CHUNK),
                    self.limits.connect_timeout_s,
                )
            except (OSError, TimeoutError) as exc:
                last = f"{address}:{port}: {exc.strerror if isinstance(exc, OSError) else exc}"
        raise Refused(f"cannot connect to {last}")

    async def pipe(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """Relays both ways until both sides are done, one side fails, or both stay idle for
        `idle_timeout_s`. Buffers stay bounded: each write waits for the peer to drain."""
        last = [time.monotonic()]
        try:
            # An idle timeout or a reset ends both directions; a clean EOF only its own.
            await both_ways(
                self._pump(client[0], upstream[1], "out", last),
                self._pump(upstream[0], client[1], "in", last),
                until_first=asyncio.FIRST_EXCEPTION,
            )
        finally:
            upstream[1].close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
        last: list[float],
    ) -> None:
        idle = self.limits.idle_timeout_s
        counter = self.metrics.bytes.labels(direction)
        while True:
            try:
                data = await asyncio.wait_for(reader.read(CHUNK), idle)
            except TimeoutError:
                if time.monotonic() - last[0] < idle:
                    continue  # the other direction is busy: this one may be quiet
                raise
            if not data:
                break
            last[0] = time.monotonic()
            counter.inc(len(data))
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()
