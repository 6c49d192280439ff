"""The user-facing API: sandboxes, templates, the proxy to daemons, health and metrics."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.exceptions
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from sandcell import __version__
from sandcell.compat import agentcube
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import BODY_BUDGET, parse_model, read_body
from sandcell.http.errors import EXCEPTION_HANDLERS, error_response
from sandcell.http.openapi import Operation, openapi, routes
from sandcell.logs import printable
from sandcell.manager.manager import Manager, within_lifetime
from sandcell.router import network, persistence, schemas, templates, websocket
from sandcell.router.auth import Authenticator, Principal
from sandcell.router.budget import ByteBudget
from sandcell.router.fairshare import FairShare
from sandcell.router.metrics import RouterMetrics
from sandcell.router.middleware import RequestContext
from sandcell.router.proxy import DaemonProxy
from sandcell.router.usage import SandboxMetrics, sandbox_metrics
from sandcell.store import Reservation, SandboxRecord, Store

MIB = 1_048_576
MAX_API_BODY = MIB
log = logging.getLogger("sandcell.router")


@dataclass
class Limits:
    max_inflight: int = 512
    max_sandboxes_per_key: int = 100
    max_inflight_per_key: int = 0  # 0: a quarter of max_inflight
    body_budget_bytes: int = 128 * MIB
    body_budget_per_key_bytes: int = 32 * MIB

    def inflight_share(self) -> int:
        return self.max_inflight_per_key or max(1, self.max_inflight // 4)


class Router:
    def __init__(
        self,
        store: Store,
        manager: Manager,
        limits: Limits | None = None,
        proxy: DaemonProxy | None = None,
    ) -> None:
        self.store = store
        self.manager = manager
        self.limits = limits or Limits()
        self.auth = Authenticator(store)
        self.proxy = proxy or DaemonProxy(store)
        self.metrics = RouterMetrics()
        self.fair_share = FairShare(self.limits.inflight_share())
        self.bodies = ByteBudget(
            self.limits.body_budget_bytes, self.limits.body_budget_per_key_bytes
        )

    async def principal(self, request: Request) -> Principal:
        """The caller, who from now on holds one of its key's in-flight slots and reads its
        body out of its key's byte budget (both given back by `release`)."""
        client = request.client.host if request.client else "unknown"
        principal = await self.auth.authenticate(request.headers.get("authorization"), client)
        self.hold(request.scope, principal.name)
        return principal

    def hold(self, scope: Scope, name: str) -> None:
        """Makes the request count against `name`'s in-flight slots and body budget (also for
        a request authorised by a credential other than an API key, for its owner's key)."""
        self.fair_share.admit(scope, name)
        scope.setdefault(BODY_BUDGET, self.bodies.lease(name))

    def release(self, scope: Scope) -> None:
        """At the end of a request, whatever `principal` made it hold."""
        self.fair_share.release(scope)
        if (lease := scope.get(BODY_BUDGET)) is not None:
            lease.release()

    async def reserve(self, owner: str) -> Reservation:
        """One of the owner's live sandbox slots, for a create or resume in flight; counting
        and holding are one store step, so concurrent creates cannot all pass."""
        limit = self.limits.max_sandboxes_per_key
        reservation = await self.store.reserve_sandbox(owner, limit)
        if reservation is None:
            raise SandcellError(
                ErrorCode.RATE_LIMITED,
                f"this key already has {limit} sandboxes",
                headers={"Retry-After": "5"},
            )
        return reservation

    async def create(self, principal: Principal, req: schemas.CreateSandbox) -> SandboxRecord:
        """A sandbox for `principal`, within its key's quota (every façade creates here)."""
        owner = None if principal.admin else principal.name
        snapshot = await self.manager.snapshots.owned(owner, req.snapshot) if req.snapshot else None
        reservation = await self.reserve(principal.name)
        return await self.manager.create_sandbox(
            principal.name,
            req.template,
            idle_timeout_s=req.idle_timeout_s,
            max_lifetime_s=req.max_lifetime_s,
            env=req.env,
            metadata=req.metadata,
            network=req.network.policy() if req.network else None,
            reservation=reservation,
            auto_resume=req.auto_resume,
            on_timeout=req.on_timeout,
            snapshot=snapshot,
            resources=req.resources.model_dump(exclude_none=True) if req.resources else None,
        )

    async def delete(self, record: SandboxRecord) -> None:
        """Answers once the sandbox is gone for its owner (its processes killed); the cell's
        teardown (unmount, loop device, cgroup) goes on in the manager's background."""
        self.proxy.forget(record)
        await self.manager.delete_sandbox(record.id, wait=False)

    async def owned(self, request: Request) -> tuple[Principal, SandboxRecord]:
        """The caller's sandbox; another principal's is 404 (its existence is not revealed)."""
        principal = await self.principal(request)
        sandbox_id = request.path_params["sandbox_id"]
        record = await self.store.get_sandbox(sandbox_id)
        if record is None or record.state == "deleted" or not principal.owns(record.owner):
            raise SandcellError(
                ErrorCode.SANDBOX_NOT_FOUND,
                f"sandbox {sandbox_id} not found",
                {"sandbox_id": sandbox_id},
            )
        return principal, record


def _router(request: Request) -> Router:
    return request.app.state.router


async def create_sandbox(request: Request) -> Response:
    r = _router(request)
    principal = await r.principal(request)
    req = parse_model(schemas.CreateSandbox, await read_body(request, MAX_API_BODY))
    record = await r.create(principal, req)
    return JSONResponse(schemas.sandbox_view(record), status_code=201)


async def list_sandboxes(request: Request) -> Response:
    r = _router(request)
    principal = await r.principal(request)
    records = await r.store.list_sandboxes(None if principal.admin else principal.name)
    views = [schemas.sandbox_view(x) for x in records if x.state != "deleted"]
    return JSONResponse({"sandboxes": views})


async def get_sandbox(request: Request) -> Response:
    _, record = await _router(request).owned(request)
    return JSONResponse(schemas.sandbox_view(record))


async def keepalive(request: Request) -> Response:
    r = _router(request)
    _, record = await r.owned(request)
    body = await read_body(request, MAX_API_BODY)
    req = parse_model(schemas.Keepalive, body) if body.strip() else schemas.Keepalive()
    if req.idle_timeout_s is not None:
        within_lifetime(r.manager.template(record.template), idle_timeout_s=req.idle_timeout_s)
    if record.state != "running":  # activity: a paused sandbox's clock is its paused TTL
        record = await persistence.wake(r, record)
    await r.store.touch(record.id, time.time(), req.idle_timeout_s)
    refreshed = await r.store.get_sandbox(record.id)
    if refreshed is None:
        raise SandcellError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {record.id} not found")
    return JSONResponse(schemas.sandbox_view(refreshed))


async def delete_sandbox(request: Request) -> Response:
    """204 when the caller's sandbox is deleted (or a deletion racing this one wins); 404
    when the caller has none by that id, another principal's included (not revealed)."""
    r = _router(request)
    _, record = await r.owned(request)
    await r.delete(record)
    return Response(status_code=204)


async def proxy(request: Request) -> Response:
    r = _router(request)
    _, record = await r.owned(request)
    if record.state != "running":
        record = await persistence.wake(r, record)
    await r.store.touch(record.id, time.time())
    return await r.proxy.forward(request, record, request.path_params["rest"])


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})


async def readyz(request: Request) -> Response:
    r = _router(request)
    try:
        await r.store.ping()
    except Exception as exc:
        raise SandcellError(ErrorCode.OVERLOADED, "the store is unreachable") from exc
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    r = _router(request)
    m = r.metrics
    m.sandboxes.clear()
    for record in await r.store.list_sandboxes():
        m.sandboxes.labels(record.state).inc()
    for name, pool in r.manager.pools.items():
        m.pool_ready.labels(name).set(len(pool))
    m.init_failures.set(r.manager.init_failures)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


async def openapi_document(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


_SBX = "/v1/sandboxes/{sandbox_id}"
_PROXY_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
OPERATIONS = (
    Operation(
        "POST",
        "/v1/sandboxes",
        create_sandbox,
        "Create a sandbox",
        body=schemas.CreateSandbox,
        response=schemas.Sandbox,
        status=201,
        errors=(403, 409, 413, 429, 503),
    ),
    Operation(
        "GET", "/v1/sandboxes", list_sandboxes, "List your sandboxes", response=schemas.SandboxList
    ),
    Operation(
        "GET", _SBX, get_sandbox, "Describe a sandbox", response=schemas.Sandbox, errors=(404,)
    ),
    Operation(
        "POST",
        f"{_SBX}/keepalive",
        keepalive,
        "Reset the idle timer",
        body=schemas.Keepalive,
        response=schemas.Sandbox,
        errors=(404,),
    ),
    Operation("DELETE", _SBX, delete_sandbox, "Delete a sandbox", status=204, errors=(404,)),
    Operation(
        "GET",
        f"{_SBX}/metrics",
        sandbox_metrics,
        "CPU, memory, pids and disk use of a sandbox (from the backend)",
        response=SandboxMetrics,
        errors=(404, 409, 501),
    ),
    *network.OPERATIONS,
    *persistence.OPERATIONS,
    *(
        Operation(
            m,
            f"{_SBX}/{{rest:path}}",
            proxy,
            "Proxied to the sandbox's daemon /v1/...",
            errors=(403, 404, 409, 413, 502, 503, 504),
        )
        for m in _PROXY_METHODS
    ),
    *templates.OPERATIONS,
    *agentcube.OPERATIONS,
    Operation("GET", "/healthz", healthz, "Liveness", secured=False),
    Operation(
        "GET", "/readyz", readyz, "Readiness (the store answers)", secured=False, errors=(503,)
    ),
    Operation(
        "GET", "/metrics", metrics, "Prometheus metrics", response="text/plain", secured=False
    ),
    Operation("GET", "/openapi.json", openapi_document, "This document", secured=False),
)


# A store that cannot be reached is a passing outage for the caller (retry), not a bug.
STORE_OUTAGES = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    sqlite3.OperationalError,
)


async def _store_unavailable(request: Request, exc: Exception) -> Response:
    # Debug only: sandcell.store.health tells the operator once when the store goes and comes.
    log.debug("store unavailable on %s %s: %s", request.method, printable(request.url.path), exc)
    error = SandcellError(
        ErrorCode.OVERLOADED,
        "the store is unavailable; retry shortly",
        headers={"Retry-After": "1"},
    )
    return error_response(error)


def create_app(router: Router) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await router.manager.start()
        try:
            yield
        finally:
            await router.manager.stop()
            await router.proxy.close()

    handlers = {**EXCEPTION_HANDLERS, **dict.fromkeys(STORE_OUTAGES, _store_unavailable)}
    app = Starlette(
        routes=[*routes(OPERATIONS), *network.WEBSOCKET_ROUTES, websocket.ROUTE],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.router = router
    app.state.openapi = openapi("sandcell", __version__, OPERATIONS, bearer_format="API key")
    app.add_middleware(RequestContext, router=router)
    return app
