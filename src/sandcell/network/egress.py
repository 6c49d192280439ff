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
import resource
import socket
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell import telemetry
from sandcell.http.limits import MIN_FD_RESERVE
from sandcell.network.metrics import EgressMetrics
from sandcell.network.policy import NONE, Decision, IPAddress, NetworkPolicy, decide, parse_policy
from sandcell.network.pumps import both_ways

if TYPE_CHECKING:
    from sandcell.network.tls.substitution import Substitution
    from sandcell.store import Store

log = logging.getLogger("sandcell.egress")

CHUNK = 65_536  # also the stream buffer limit: at most a few chunks are held per connection
PolicyLookup = Callable[[str], Awaitable[NetworkPolicy]]
OwnerLookup = Callable[[str], Awaitable[str | None]]  # a sandbox's principal, None if unclaimed
Resolver = Callable[[str, int], Awaitable[list[str]]]
Handler = Callable[
    ["EgressService", str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]
# Answers a connection refused for a bound in the proxy's own protocol: (status, reason).
Refuser = Callable[
    ["EgressService", asyncio.StreamReader, asyncio.StreamWriter, int, str], Awaitable[None]
]
# Refusals spoken at once (each holds one descriptor for at most `head_timeout_s`); beyond
# these a connection past a bound is closed without an answer.
REFUSALS_PER_OWNER = 4
REFUSALS = 32


@dataclass(frozen=True)
class EgressLimits:
    max_connections: int = 64  # per sandbox, both proxies together
    max_connections_per_owner: int = 0  # all the owner's sandboxes; 0: a quarter of the total
    max_connections_total: int = 0  # every sandbox of this process; 0: from RLIMIT_NOFILE
    idle_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    head_timeout_s: float = 10.0  # a client must send its request (or SOCKS greeting) by then

    def total_cap(self) -> int:
        """A tunnel holds two descriptors (the cell's side and the upstream): together at
        most a quarter of what the router's connection cap leaves, as WebSocket sessions."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = max(8, (soft - MIN_FD_RESERVE) // 8)
        total = self.max_connections_total
        return min(total, ceiling) if total else ceiling

    def owner_cap(self) -> int:
        """One principal's share, a quarter of the total by default: its sandboxes together
        cannot take every tunnel."""
        total = self.total_cap()
        per_owner = self.max_connections_per_owner
        return min(per_owner, total) if per_owner else max(1, total // 4)


class Refused(Exception):
    """An allowed destination that cannot be reached; `reason` is shown to the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def connect_failure(address: str, port: int, exc: OSError) -> str:
    """Why `address` could not serve a connection (TLS verification too), as clients see it."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{address}:{port}: its certificate failed verification: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"{address}:{port}: TLS failed: {exc.reason or exc}"
    return f"{address}:{port}: {exc.strerror or exc or 'timed out'}"


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


def owner_from_store(store: Store) -> OwnerLookup:
    """The principal a sandbox belongs to (None for a pool cell no one has claimed)."""

    async def lookup(sandbox_id: str) -> str | None:
        record = await store.get_sandbox(sandbox_id)
        return record.owner if record is not None else None

    return lookup


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
    owner: str | None = None  # looked up once claimed; a sandbox never changes hands


class EgressService:
    def __init__(
        self,
        policy_for: PolicyLookup,
        *,
        owner_for: OwnerLookup | None = None,
        resolver: Resolver = system_resolver,
        limits: EgressLimits | None = None,
        own_addresses: Iterable[IPAddress] | None = None,
        substitution: Substitution | None = None,
    ) -> None:
        self.policy_for = policy_for
        self.substitution = substitution  # secrets (SPEC §17); None: every CONNECT a tunnel
        self.owner_for = owner_for
        self.resolver = resolver
        self.limits = limits or EgressLimits()
        self.own = frozenset(host_addresses() if own_addresses is None else own_addresses)
        self.metrics = EgressMetrics(lambda: self._held)
        self._sandboxes: dict[str, _Sandbox] = {}
        self._by_owner: Counter[str] = Counter()  # connections per owner, every sandbox
        self._held = 0  # connections of every sandbox
        self._refusing: Counter[str] = Counter()  # refusals being spoken, per owner
        # Told each decision (sandbox, host, port, allowed): the audit trail (SPEC §20).
        self.on_decision: Callable[[str, str, int, bool], None] | None = None

    # -- listeners ------------------------------------------------------------------------

    async def serve(self, sandbox_id: str, http: socket.socket, socks: socket.socket) -> None:
        """Starts serving a sandbox's two listening sockets (already bound and listening)."""
        from sandcell.network import http_proxy, socks5  # the handlers import this module

        self._close_listeners(sandbox_id)
        entry = self._sandboxes[sandbox_id] = _Sandbox()
        for sock, handler, refuser in (
            (http, http_proxy.handle, http_proxy.refuse),
            (socks, socks5.handle, socks5.refuse),
        ):
            sock.setblocking(False)
            server = await asyncio.start_server(
                self._guarded(sandbox_id, handler, refuser), sock=sock, limit=CHUNK
            )
            entry.servers.append(server)

    async def detach(self, sandbox_id: str) -> None:
        """The sandbox's cell is gone: its listeners close, its CA is forgotten."""
        self._close_listeners(sandbox_id)
        if self.substitution is not None:
            self.substitution.forget(sandbox_id)

    def _close_listeners(self, sandbox_id: str) -> None:
        entry = self._sandboxes.pop(sandbox_id, None)
        for server in entry.servers if entry else []:
            server.close()

    async def close(self) -> None:
        """Stops serving; the sandboxes' CAs stay (a restarted server adopts their cells)."""
        for sandbox_id in list(self._sandboxes):
            self._close_listeners(sandbox_id)
        if self.substitution is not None:  # intercepted connections run in threads
            await self.substitution.relays.close()

    @property
    def held(self) -> int:
        """Connections open through the proxies, every sandbox together."""
        return self._held

    def held_by(self, owner: str) -> int:
        return self._by_owner[owner]

    @property
    def served(self) -> frozenset[str]:
        """The sandboxes whose listeners are open."""
        return frozenset(self._sandboxes)

    def _guarded(
        self, sandbox_id: str, handler: Handler, refuser: Refuser
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        """Counts the connection against its sandbox, its owner and the process, refuses past
        a bound (so one tenant cannot take the router's descriptors), always closes."""

        async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            entry = self._sandboxes.get(sandbox_id)
            try:
                if entry is None:
                    return
                if entry.connections >= self.limits.max_connections:
                    self._limited(sandbox_id, "sandbox", None)
                    return
                if self._held >= self.limits.total_cap():
                    reason = f"the egress proxies hold {self._held} connections, their bound"
                    await self._refuse(sandbox_id, "total", reader, writer, refuser, 503, reason)
                    return
                entry.connections += 1  # counted at once: the owner's lookup awaits the store
                self._held += 1
                try:
                    with telemetry.span("egress.connection", {"sandcell.sandbox_id": sandbox_id}):
                        await self._serve_owned(sandbox_id, entry, handler, refuser, reader, writer)
                finally:
                    entry.connections -= 1
                    self._held -= 1
            finally:
                writer.close()

        return serve_one

    async def _serve_owned(
        self,
        sandbox_id: str,
        entry: _Sandbox,
        handler: Handler,
        refuser: Refuser,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        try:
            owner = await self._owner(sandbox_id, entry)
            cap = self.limits.owner_cap()
            if self._by_owner[owner] >= cap:
                reason = f"this key's sandboxes hold {cap} egress connections, its bound"
                await self._refuse(sandbox_id, "owner", reader, writer, refuser, 429, reason, owner)
                return
            self._by_owner[owner] += 1
            try:
                await handler(self, sandbox_id, reader, writer)
            finally:
                self._by_owner[owner] -= 1
                if not self._by_owner[owner]:
                    del self._by_owner[owner]
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        except Exception:
            # A store outage while looking up the policy, say: this connection ends
            # (closed, so nothing passes), the proxy goes on serving.
            log.exception("egress sandbox=%s: connection failed", sandbox_id)

    async def _owner(self, sandbox_id: str, entry: _Sandbox) -> str:
        """The sandbox's principal (cached once known); an unclaimed cell counts alone."""
        if entry.owner is None and self.owner_for is not None:
            entry.owner = await self.owner_for(sandbox_id)
        return entry.owner or f"sandbox:{sandbox_id}"

    def _limited(self, sandbox_id: str, bound: str, reason: str | None) -> None:
        self.metrics.decisions.labels("refused").inc()
        self.metrics.limited.labels(bound).inc()
        log.warning(
            "egress sandbox=%s decision=refused bound=%s reason=%s",
            sandbox_id,
            bound,
            reason or "too many connections",
        )

    async def _refuse(
        self,
        sandbox_id: str,
        bound: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        refuser: Refuser,
        status: int,
        reason: str,
        owner: str = "",
    ) -> None:
        """Answers in the proxy's protocol while few refusals are under way (each holds a
        descriptor until the client's request arrives); past that, closes without a word."""
        self._limited(sandbox_id, bound, reason)
        spoken = sum(self._refusing.values())
        if spoken >= REFUSALS or (owner and self._refusing[owner] >= REFUSALS_PER_OWNER):
            return
        self._refusing[owner] += 1
        try:
            await refuser(self, reader, writer, status, reason)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._refusing[owner] -= 1
            if not self._refusing[owner]:
                del self._refusing[owner]

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
        telemetry.annotate(
            {"server.address": host, "server.port": port, "sandcell.decision": verdict}
        )
        if self.on_decision is not None:
            self.on_decision(sandbox_id, host, port, decision.allowed)
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
        self,
        decision: Decision,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the first checked address that answers (never a re-resolved name);
        with `tls`, over TLS verified for `server_hostname` (SNI and the certificate's name)."""
        last = "no address"
        for address in decision.addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(
                        address,
                        port,
                        limit=CHUNK,
                        ssl=tls,
                        server_hostname=server_hostname if tls else None,
                    ),
                    self.limits.connect_timeout_s,
                )
            except OSError as exc:  # TLS and timeouts too
                last = connect_failure(address, port, exc)
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
