"""The router's core: the one call path from every entry point to a sandbox's daemon.

`/v1`, preview URLs, port relays, WebSocket attach and both façades are adapters: each says
what it wants of a daemon as a `Call` (or a WebSocket target) and who pays for it, and the
core does what every call needs, in one place:

- the caller's slot, byte lease and sessions are held at the door (`door.Door`);
- a paused sandbox is woken first when it was created with `auto_resume` (else 409);
- the call counts as the sandbox's activity;
- a fresh single-use request token is minted for exactly this method, path and body;
- the hop goes over a pooled connection of the one dialer (`cellapi.client.dialer`), and its
  failures become the spec's errors (`map_errors`), as does a daemon's own error answer
  (`daemon_error`).

Nothing here knows Starlette's requests: an adapter turns its protocol into a `Call` and the
`Answer` back into its protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection

from sandcell import telemetry, tokens
from sandcell.audit import calls as audit_calls
from sandcell.audit.trail import CALLER, AuditTrail, Caller, recorded, status_of
from sandcell.cellapi.client import dialer
from sandcell.cellapi.limits import answer_within_s
from sandcell.console import session as console_session
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.hop import request_target_bytes
from sandcell.http.upstream import (
    Connection,
    Dial,
    Headers,
    Pool,
    UpstreamError,
    UpstreamTimeout,
    request_head,
)
from sandcell.network import websocket as ws
from sandcell.router.auth import Authenticator, Principal
from sandcell.router.door import Door, Limits
from sandcell.router.metrics import RouterMetrics
from sandcell.store import Reservation, SandboxRecord, SnapshotRecord, Store

if TYPE_CHECKING:
    from sandcell.manager.manager import Manager
    from sandcell.router.schemas import CreateSandbox
    from sandcell.secrets.grants import Grant

CONNECT_TIMEOUT_S = 2.0
# A daemon's answer of at most this length, whole within the grace, goes back as one
# buffered response (a slower one, e.g. from a user's server behind a port, is relayed).
BUFFER_ANSWERS_UP_TO = 256 * 1024
BUFFER_GRACE_S = 0.25
TOUCH_EVERY_S = 10.0  # a WebSocket session's activity: one store write per this, at most
log = logging.getLogger("sandcell.router")
# States a call can no longer reach a sandbox in (a paused one it wakes, see `ready`).
GONE = frozenset({"deleting", "deleted", "failed"})

# A daemon endpoint to how to connect to it and the Host its requests name.
DialerFactory = Callable[[dict[str, Any]], tuple[Dial, bytes]]


@dataclass(frozen=True, slots=True)
class Call:
    """One request to a sandbox's daemon, as every entry point describes it."""

    method: str
    target: str  # the daemon's path and query, "/v1/...", as it goes on the wire
    headers: Sequence[tuple[bytes, bytes]] = ()  # end-to-end headers, names lower-case
    body: bytes | None = b""  # the whole body, bound to the token; None when streamed
    stream: AsyncIterator[bytes] | None = None
    length: int | None = None  # of a streamed body; None sends it chunked

    @classmethod
    def json(cls, method: str, target: str, payload: Any) -> Call:
        body = json.dumps(payload).encode()
        return cls(method, target, ((b"content-type", b"application/json"),), body)


def daemon_error(status: int, data: bytes) -> ServiceError:
    """A daemon's SPEC §1 error as the same ServiceError, so each adapter maps it once; an
    answer that is not one means the sandbox misbehaved, not the router."""
    try:
        error = json.loads(data)["error"]
        return ServiceError(ErrorCode(error["code"]), str(error["message"]), error.get("details"))
    except (ValueError, KeyError, TypeError, RecursionError):
        return ServiceError(ErrorCode.SANDBOX_UNREACHABLE, f"the sandbox answered {status}")


@contextlib.contextmanager
def map_errors(sandbox_id: str) -> Iterator[None]:
    """The one place the hop's failures become the spec's errors."""
    try:
        yield
    except (UpstreamTimeout, TimeoutError) as exc:
        raise ServiceError(
            ErrorCode.SANDBOX_TIMEOUT,
            "the sandbox did not answer in time",
            {"sandbox_id": sandbox_id},
        ) from exc
    except (UpstreamError, OSError) as exc:
        raise ServiceError(
            ErrorCode.SANDBOX_UNREACHABLE,
            "the sandbox is unreachable",
            {"sandbox_id": sandbox_id},
        ) from exc


class Answer:
    """A daemon's answer: its head, and its body whole (`read`, `json`) or as it comes
    (`chunks`). An answer whole by the time its head was read (most are) gives its
    connection back at once; a streamed one when its body has been read, or closes it if
    the answer is abandoned (`close`)."""

    def __init__(
        self, sandbox_id: str, pool: Pool, conn: Connection, timeout: float | None
    ) -> None:
        self.sandbox_id = sandbox_id
        self.status = conn.status
        self.headers = conn.headers
        self._pool = pool
        self._conn = conn
        self._timeout = timeout
        self._done = False
        self._data: bytes | None = None
        if conn.complete:
            self._data = conn.body()
            self.release()

    @property
    def complete(self) -> bool:
        """The whole body has arrived already."""
        return self._data is not None

    def body(self) -> bytes:
        """The body of a complete answer."""
        if self._data is None:
            raise RuntimeError("body() of an answer still streaming: use chunks()")
        return self._data

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes; a hop cut short ends it early (the caller sees a truncated
        body, as the daemon's headers are gone already)."""
        if self._data is not None:
            yield self._data
            return
        try:
            while (chunk := await self._conn.next_chunk(self._timeout)) is not None:
                yield chunk
        except UpstreamError:
            self._conn.close()
        finally:
            self.release()

    async def json(self) -> Any:
        """The daemon's JSON answer; its error answer raised as the same error."""
        data = await self.read()
        if self.status >= 400:
            raise daemon_error(self.status, data)
        try:
            return json.loads(data) if data else None
        except (ValueError, RecursionError) as exc:
            raise ServiceError(ErrorCode.SANDBOX_UNREACHABLE, "the sandbox answered oddly") from exc

    async def raise_for_error(self) -> Answer:
        if self.status >= 400:
            raise daemon_error(self.status, await self.read())
        return self

    def close(self) -> None:
        """Abandons the answer (the client went away): its connection is not reused."""
        if not self._done:
            self._conn.close()
        self.release()

    def release(self) -> None:
        """The connection back to its pool if the answer was read whole, else closed
        (once, however often it is called)."""
        if not self._done:
            self._done = True
            self._pool.release(self._conn)


class _Lru(OrderedDict[str, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def get_fresh(self, key: str) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None

    def put(self, key: str, value: Any) -> Any:
        """Stores `value`; returns the evicted value, if any."""
        self[key] = value
        if len(self) > self.capacity:
            return self.popitem(last=False)[1]
        return None


class Hop:
    """Signed requests to daemons over pooled connections. `dialer_for` maps a daemon
    endpoint to a way of connecting to it; tests pass one that reaches a daemon app served
    in-process."""

    def __init__(
        self,
        store: Store,
        key_cache_size: int = 4096,
        max_pools: int = 1024,
        dialer_for: DialerFactory = dialer,
    ) -> None:
        self.store = store
        self._dialer_for = dialer_for
        self._keys = _Lru(key_cache_size)
        self._pools = _Lru(max_pools)

    async def close(self) -> None:
        for pool, _ in self._pools.values():
            pool.close()
        self._pools.clear()

    def forget(self, record: SandboxRecord) -> None:
        """Drops what is cached for a sandbox whose cell ends: its key and its connections."""
        self._keys.pop(record.id, None)
        entry = self._pools.pop(_ident(record.endpoint), None)
        if entry is not None:
            entry[0].close()

    async def session_key(self, sandbox_id: str) -> tokens.PrivateKey:
        key = self._keys.get_fresh(sandbox_id)
        if key is None:
            pem = await self.store.get_session_key(sandbox_id)
            if pem is None:
                raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {sandbox_id} not found")
            key = tokens.load_private_key(pem)
            self._keys.put(sandbox_id, key)
        return key

    def _pool(self, endpoint: dict[str, Any]) -> tuple[Pool, bytes]:
        ident = _ident(endpoint)
        entry = self._pools.get_fresh(ident)
        if entry is None:
            dial, host = self._dialer_for(endpoint)
            entry = (Pool(dial), host)
            if (evicted := self._pools.put(ident, entry)) is not None:
                evicted[0].close()
        return entry

    async def exchange(self, record: SandboxRecord, call: Call) -> Answer:
        if (tracing := telemetry.active) is not None:  # SPEC §20: the hop's span, carried
            return await tracing.hop(self._exchange, record, call)
        return await self._exchange(record, call)

    async def _exchange(self, record: SandboxRecord, call: Call) -> Answer:
        key = await self.session_key(record.id)
        token = tokens.mint_request_token(key, record.id, call.method, call.target, call.body)
        pool, host = self._pool(record.endpoint)
        head = _head(call, host, token)
        timeout = answer_within_s(call.target, call.body)
        with map_errors(record.id):
            conn = await pool.acquire(CONNECT_TIMEOUT_S)
            try:
                if call.stream is None:
                    conn.send(head + (call.body or b""))
                else:
                    await conn.send_stream(head, call.stream, call.length is None, timeout)
                await conn.response_head(timeout)
                await conn.whole_if_within(BUFFER_ANSWERS_UP_TO, BUFFER_GRACE_S)
            except BaseException:
                conn.close()
                raise
        return Answer(record.id, pool, conn, timeout)

    async def open_stream(
        self, record: SandboxRecord
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        """A fresh connection to the daemon as streams (a WebSocket's), and its Host."""
        dial, host = self._dialer_for(record.endpoint)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=ws.CHUNK)
        protocol = asyncio.StreamReaderProtocol(reader)
        with map_errors(record.id):
            transport, _ = await asyncio.wait_for(dial(lambda: protocol), CONNECT_TIMEOUT_S)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        return reader, writer, host.decode("latin-1")


def _ident(endpoint: dict[str, Any]) -> str:
    return json.dumps(endpoint, sort_keys=True)


def _head(call: Call, host: bytes, token: str) -> bytes:
    """The daemon's request head: the caller's end-to-end headers, the token, the framing."""
    headers: Headers = list(call.headers)
    headers.append((b"authorization", b"Bearer " + token.encode()))
    length = len(call.body) if call.body is not None else call.length
    if length is None:
        headers.append((b"transfer-encoding", b"chunked"))
    else:
        headers.append((b"content-length", b"%d" % length))
    try:
        return request_head(call.method, request_target_bytes(call.target), host, headers)
    except ValueError as exc:
        raise ServiceError(ErrorCode.BAD_REQUEST, "invalid request head") from exc


class Activity:
    """A long session's traffic counts as its sandbox's activity, so a terminal is not
    reaped as idle: one store write per TOUCH_EVERY_S at most (or a third of the idle
    timeout when that is shorter)."""

    def __init__(self, store: Store, record: SandboxRecord) -> None:
        self.store = store
        self.sandbox_id = record.id
        self.every_s = min(TOUCH_EVERY_S, record.idle_timeout_s / 3)
        self._last = time.monotonic()

    async def seen(self) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            try:
                await self.store.touch(self.sandbox_id, time.time())
            except Exception as exc:  # a store outage must not cut a live session
                log.warning("could not record activity of %s: %s", self.sandbox_id, exc)


class Router:
    """Who calls, what they may hold, and the one way to their sandboxes' daemons."""

    def __init__(
        self,
        store: Store,
        manager: Manager,
        limits: Limits | None = None,
        hop: Hop | None = None,
        audit: AuditTrail | None = None,
    ) -> None:
        self.store = store
        self.manager = manager
        self.audit = audit  # SPEC §20: every action through the core is recorded there
        self.limits = limits or Limits()
        self.auth = Authenticator(store)
        self.hop = hop or Hop(store)
        self.door = Door(self.limits)
        self.metrics = RouterMetrics()
        # Awaited with each deleted sandbox's id: what a façade keeps of it goes too (E2B's
        # metrics samples).
        self.on_delete: list[Callable[[str], Awaitable[None]]] = []

    # -- callers ---------------------------------------------------------------------------

    async def authenticate(self, conn: HTTPConnection, api_key: str | None = None) -> Principal:
        """The principal of the request's Bearer API key (or of `api_key`, which a façade
        found in a header of its own protocol), else of the console's session cookie (with
        its CSRF checks), holding nothing yet."""
        client = conn.client.host if conn.client else "unknown"
        authorization = (
            conn.headers.get("authorization") if api_key is None else f"Bearer {api_key}"
        )
        if console_session.presented(conn, api_key):  # the console's cookie (SPEC §19)
            principal, _ = await console_session.principal(conn, self.store)
        else:
            principal = await self.auth.authenticate(authorization, client)
        CALLER.set(Caller(principal.name, principal.key_name))  # this request's task only
        return principal

    async def principal(self, conn: HTTPConnection, api_key: str | None = None) -> Principal:
        """The caller, who from now on holds one of its key's in-flight slots and reads its
        body out of its key's byte budget (a WebSocket holds a session instead, see
        `websocket`)."""
        principal = await self.authenticate(conn, api_key)
        if self.audit is not None:
            self.audit.admit()  # no action runs unrecorded
        if conn.scope["type"] == "http":
            self.door.admit(conn.scope, principal.name)
        return principal

    async def owned(self, conn: HTTPConnection) -> tuple[Principal, SandboxRecord]:
        """The caller's sandbox; another principal's is 404 (its existence is not revealed)."""
        principal = await self.principal(conn)
        return principal, await self.sandbox_of(principal, conn.path_params["sandbox_id"])

    async def sandbox_of(self, principal: Principal, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get_sandbox(sandbox_id)
        if record is None or record.state == "deleted" or not principal.owns(record.owner):
            raise ServiceError(
                ErrorCode.SANDBOX_NOT_FOUND,
                f"sandbox {sandbox_id} not found",
                {"sandbox_id": sandbox_id},
            )
        return record

    async def owner_active(self, record: SandboxRecord) -> bool:
        """Whether the key that owns `record` still works: credentials it handed out (an
        agentcube session id) die with it."""
        keys = await self.store.list_api_keys()
        return any(k.principal == record.owner and not k.revoked for k in keys)

    # -- sandboxes -------------------------------------------------------------------------

    async def reserve(self, owner: str) -> Reservation:
        """One of the owner's live sandbox slots, for a create or resume in flight; counting
        and holding are one store step, so concurrent creates cannot all pass."""
        limit = self.limits.max_sandboxes_per_key
        reservation = await self.store.reserve_sandbox(owner, limit)
        if reservation is None:
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                f"this key already has {limit} sandboxes",
                headers={"Retry-After": "5"},
            )
        return reservation

    async def create(self, principal: Principal, req: CreateSandbox) -> SandboxRecord:
        """A sandbox for `principal`, within its key's quota (every façade creates here)."""
        touched = {"template": req.template, **({"snapshot": req.snapshot} if req.snapshot else {})}
        with recorded(self.audit, "sandbox.create", touched=touched) as made:
            record = await self._create(principal, req)
            made["sandbox_id"] = record.id
        return record

    async def _create(self, principal: Principal, req: CreateSandbox) -> SandboxRecord:
        owner = None if principal.admin else principal.name
        snapshot = await self.manager.snapshots.owned(owner, req.snapshot) if req.snapshot else None
        granted = await self._grant(principal, req, snapshot)
        reservation = await self.reserve(principal.name)
        return await self.manager.create_sandbox(
            principal.name,
            req.template,
            idle_timeout_s=req.idle_timeout_s,
            max_lifetime_s=req.max_lifetime_s,
            env={**req.env, **granted.env},
            metadata=req.metadata,
            network=granted.network,
            secrets=granted.placeholders,
            reservation=reservation,
            auto_resume=req.auto_resume,
            on_timeout=req.on_timeout,
            snapshot=snapshot,
            resources=req.resources.model_dump(exclude_none=True) if req.resources else None,
        )

    async def _grant(
        self, principal: Principal, req: CreateSandbox, snapshot: SnapshotRecord | None
    ) -> Grant:
        """The placeholders and egress of the secrets a create names (SPEC §17)."""
        from sandcell.secrets.grants import Grant, grant

        if not req.secrets:
            return Grant(network=req.network.policy() if req.network else None)
        template = self.manager.template(snapshot.template if snapshot else req.template)
        return await grant(
            self.store,
            principal.name,
            req.secrets,
            env=req.env,
            network=req.network.policy() if req.network else None,
            default_network=template.egress_policy().public(),
            network_max=template.network_max,
        )

    async def delete(self, record: SandboxRecord) -> None:
        """Answers once the sandbox is gone for its owner (its processes killed); the cell's
        teardown (unmount, loop device, cgroup) goes on in the manager's background."""
        self.hop.forget(record)
        await self.manager.delete_sandbox(record.id, wait=False)
        for forget in self.on_delete:
            await forget(record.id)

    async def ready(self, record: SandboxRecord) -> SandboxRecord:
        """The running sandbox a call goes to, its activity recorded: a paused one is resumed
        first if it was created with auto_resume, else 409 SANDBOX_PAUSED."""
        from sandcell.router import persistence  # its routes import this module

        if record.state != "running":
            record = await persistence.wake(self, record)
        await self.store.touch(record.id, time.time())
        return record

    async def keepalive(self, record: SandboxRecord, idle_timeout_s: int | None) -> SandboxRecord:
        """The idle timer reset (and set, when given, which the audit trail records); a
        paused sandbox wakes, as for any call (a paused sandbox's clock is its paused TTL)."""
        if idle_timeout_s is None:
            return await self._keepalive(record, None)
        with recorded(self.audit, "sandbox.timeout", record.id, {"timeout_s": idle_timeout_s}):
            return await self._keepalive(record, idle_timeout_s)

    async def _keepalive(self, record: SandboxRecord, idle_timeout_s: int | None) -> SandboxRecord:
        from sandcell.manager.manager import within_lifetime

        if idle_timeout_s is not None:
            within_lifetime(self.manager.template(record.template), idle_timeout_s=idle_timeout_s)
        record = await self.ready(record)
        await self.store.touch(record.id, time.time(), idle_timeout_s)
        refreshed = await self.store.get_sandbox(record.id)
        if refreshed is None:
            raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {record.id} not found")
        return refreshed

    async def set_end(
        self, record: SandboxRecord, timeout_s: int, *, extend_only: bool = False
    ) -> SandboxRecord:
        """A deadline timeout (E2B's, SPEC §14.2): the sandbox ends `timeout_s` from now,
        sooner or later than before (its lifetime and its idle timeout both), at most the
        template's max_lifetime_s from now; with `extend_only` a later end is kept. A paused
        sandbox wakes first, as for any call."""
        with recorded(self.audit, "sandbox.timeout", record.id, {"timeout_s": timeout_s}):
            return await self._set_end(record, timeout_s, extend_only=extend_only)

    async def _set_end(
        self, record: SandboxRecord, timeout_s: int, *, extend_only: bool
    ) -> SandboxRecord:
        from sandcell.manager.manager import within_lifetime

        within_lifetime(self.manager.template(record.template), timeout=timeout_s)
        record = await self.ready(record)
        for _ in range(3):  # lost to a concurrent write of the record: read it again
            fresh = await self.store.get_sandbox(record.id)
            if fresh is None:
                raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {record.id} not found")
            now = time.time()
            if extend_only and fresh.deadline >= now + timeout_s:
                return fresh
            ended = dataclasses.replace(
                fresh, expires_at=now + timeout_s, idle_timeout_s=timeout_s, last_activity_at=now
            )
            if await self.store.transition(ended, ("running",)):
                self.manager.reaper.due_at(ended.deadline)
                return ended
        raise ServiceError(ErrorCode.CONFLICT, f"sandbox {record.id} is changing; retry")

    # -- the hop ---------------------------------------------------------------------------

    async def send(self, record: SandboxRecord, call: Call) -> Answer:
        """`call` on the sandbox's daemon, signed for exactly this method, path and body."""
        action = None
        if self.audit is not None:
            action = audit_calls.classify(
                call.method, call.target, call.body, call.length, self.audit.commands
            )
        try:
            record = await self.ready(record)
            self.metrics.daemon_calls.labels(call.method).inc()
            answer = await self.hop.exchange(record, call)
        except BaseException as exc:
            if action is not None and not isinstance(exc, asyncio.CancelledError):
                self._note(action, record, status_of(exc))
            raise
        if action is not None:
            self._note(action, record, answer.status, answer.headers)
        return answer

    def _note(
        self,
        action: tuple[audit_calls.Action, audit_calls.Touched],
        record: SandboxRecord,
        status: int,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        assert self.audit is not None
        name, touched = action
        if name == "file.read" and status < 400:
            length = next((v for k, v in headers if k.lower() == b"content-length"), None)
            if length is not None and length.isdigit():
                touched = {**touched, "size": int(length)}
        # No caller: a sandbox-bound credential (an E2B access token), its owner's.
        caller = CALLER.get() or Caller(record.owner)
        self.audit.note(name, sandbox_id=record.id, status=status, touched=touched, caller=caller)

    @contextlib.asynccontextmanager
    async def websocket(
        self,
        record: SandboxRecord,
        target: str,
        payer: str,
        subprotocols: Sequence[str] = (),
    ) -> AsyncIterator[tuple[ws.Upstream, Activity]]:
        """A WebSocket to the daemon's `target`, upgraded with a token bound to `GET target`,
        held as one of `payer`'s sessions until the block ends. A refusal by the daemon is
        `ws.Rejected` (its status and body), before the caller accepts its own upgrade."""
        attach = audit_calls.attach(target) if self.audit is not None else None
        with self.door.session(payer):
            record = await self.ready(record)
            key = await self.hop.session_key(record.id)
            token = tokens.mint_request_token(key, record.id, "GET", target, b"")  # no body
            reader, writer, host = await self.hop.open_stream(record)
            upstream = ws.Upstream(reader, writer)
            try:
                try:
                    with map_errors(record.id):
                        await upstream.handshake(
                            host,
                            target,
                            headers=[(b"authorization", f"Bearer {token}".encode())],
                            subprotocols=subprotocols,
                        )
                except (ServiceError, ws.Rejected) as exc:
                    if attach is not None:
                        self._note(attach, record, exc.status)
                    raise
                if attach is not None:
                    self._note(attach, record, 101)
                yield upstream, Activity(self.store, record)
            finally:
                upstream.close()

    async def close(self) -> None:
        await self.hop.close()
