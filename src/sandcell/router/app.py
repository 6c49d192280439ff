"""The user-facing API: sandboxes, templates, the proxy to daemons, health and metrics."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator

import redis.exceptions
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount

from sandcell import __version__
from sandcell.compat import agentcube, e2b
from sandcell.console import session as console_session
from sandcell.console.app import create_console
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import parse_model, read_body
from sandcell.http.errors import EXCEPTION_HANDLERS, error_response
from sandcell.http.hop import check_path
from sandcell.http.openapi import Operation, openapi, routes
from sandcell.logs import printable
from sandcell.router import (
    audit,
    network,
    persistence,
    proxy,
    schemas,
    secrets,
    templates,
    websocket,
)
from sandcell.router.core import Router
from sandcell.router.door import Limits
from sandcell.router.middleware import RequestContext
from sandcell.router.usage import SandboxMetrics, sandbox_metrics

__all__ = ["Limits", "Router", "create_app"]

MAX_API_BODY = 1_048_576
log = logging.getLogger("sandcell.router")


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
    return JSONResponse(schemas.sandbox_view(await r.keepalive(record, req.idle_timeout_s)))


async def delete_sandbox(request: Request) -> Response:
    """204 when the caller's sandbox is deleted (or a deletion racing this one wins); 404
    when the caller has none by that id, another principal's included (not revealed)."""
    r = _router(request)
    _, record = await r.owned(request)
    await r.delete(record)
    return Response(status_code=204)


async def proxied(request: Request) -> Response:
    r = _router(request)
    _, record = await r.owned(request)
    check_path(request.path_params["rest"])
    target = proxy.sandbox_target(request, f"/v1/sandboxes/{record.id}/")
    return await proxy.forward(r, request, record, target)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})


async def readyz(request: Request) -> Response:
    r = _router(request)
    try:
        await r.store.ping()
    except Exception as exc:
        raise ServiceError(ErrorCode.OVERLOADED, "the store is unreachable") from exc
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
            proxied,
            "Proxied to the sandbox's daemon /v1/...",
            errors=(403, 404, 409, 413, 502, 503, 504),
        )
        for m in _PROXY_METHODS
    ),
    *templates.OPERATIONS,
    *secrets.OPERATIONS,  # SPEC §17
    *audit.OPERATIONS,  # SPEC §20
    *agentcube.OPERATIONS,
    *e2b.OPERATIONS,  # E2B's wire protocol under /e2b (SPEC §14)
    *e2b.ROOT_OPERATIONS,  # and its signed file URLs, which land at the root
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
    error = ServiceError(
        ErrorCode.OVERLOADED,
        "the store is unavailable; retry shortly",
        headers={"Retry-After": "1"},
    )
    return error_response(error)


def create_app(router: Router) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if router.audit is not None:
            await router.audit.start()
        try:
            await router.manager.start()
            try:
                yield
            finally:
                await router.manager.stop()
                await router.close()
        finally:
            if router.audit is not None:
                await router.audit.close()  # after the manager: its last records go too

    handlers = {**EXCEPTION_HANDLERS, **dict.fromkeys(STORE_OUTAGES, _store_unavailable)}
    app = Starlette(
        routes=[
            *routes(OPERATIONS),
            *e2b.NOT_SERVED,
            *network.WEBSOCKET_ROUTES,
            websocket.ROUTE,
            Mount("/ui", create_console(router)),  # the web console (SPEC §19)
        ],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.router = router
    app.state.openapi = openapi(
        "sandcell",
        __version__,
        OPERATIONS,
        bearer_format="API key",
        schemes=e2b.SECURITY_SCHEMES,
    )
    app.add_middleware(console_session.WebSocketToken)
    app.add_middleware(RequestContext, router=router)
    return app
