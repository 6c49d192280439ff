"""The daemon's HTTP API (SPEC §2): its state, health, init and port relays, and the one
table that assembles every job's operations (exec, files, processes, code) behind the guard."""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from sandcell import __version__
from sandcell.cellapi import schemas
from sandcell.cellapi.environment import build_env, validate_env
from sandcell.cellapi.layout import WORKSPACE_ALIASES
from sandcell.daemon.code.contexts import Contexts
from sandcell.daemon.code.routes import CODE_OPERATIONS
from sandcell.daemon.config import DaemonConfig
from sandcell.daemon.exec.routes import EXEC_OPERATIONS
from sandcell.daemon.exec.runner import CommandSpec, Runner
from sandcell.daemon.files.operations import Files
from sandcell.daemon.files.places import Places
from sandcell.daemon.files.root import CellRoot
from sandcell.daemon.files.routes import CELL_FILE_OPERATIONS, FILE_OPERATIONS
from sandcell.daemon.files.workspace import Workspace
from sandcell.daemon.http.auth import Guard
from sandcell.daemon.http.steps import TracedSteps
from sandcell.daemon.http.table import (
    JSON_BODY,
    DaemonOperation,
    WebSocketOperation,
    call_of,
    json_of,
    routes,
)
from sandcell.daemon.processes import routes as process_routes
from sandcell.daemon.processes.table import ProcessTable
from sandcell.http.bodies import read_body
from sandcell.http.errors import EXCEPTION_HANDLERS
from sandcell.http.openapi import Operation, openapi


class Daemon:
    """State of one daemon: its guard, workspace and running commands."""

    def __init__(self, config: DaemonConfig, environ: dict[str, str]) -> None:
        self.config = config
        self.guard = Guard(config.sandbox_id, config.bootstrap_key)
        self.workspace = Workspace(config.workspace, WORKSPACE_ALIASES)
        self.files: Files = Files(Places(self.workspace), config.disk_quota_bytes)
        scratch = Workspace(config.scratch, place=config.scratch)
        root = CellRoot() if config.in_cell else None  # outside a cell, `/` is the host's
        self.cell_files: Files = Files(
            Places(self.workspace, scratch, root=root), config.disk_quota_bytes
        )
        self.runner = Runner()
        self.processes = ProcessTable(self.runner)
        self.contexts = Contexts(config.code_python, lambda: self.command_env(None), self.runner)
        self.started = time.monotonic()
        # A snapshot: commands read the allow-listed names from it, never os.environ itself.
        self._environ = dict(environ)

    def home(self) -> str:
        """Where commands and code contexts start unless told: the sandbox's $HOME (its
        default env) when that names the workspace (E2B's sandboxes set /home/user, SPEC
        §14.2), else the workspace's own path."""
        home = self.guard.default_env.get("HOME", "")
        return home if home in self.workspace.names else self.workspace.root

    def directory(self, path: str | None) -> str:
        """An existing directory of the workspace as a working directory; a relative one is
        taken from `home()`, an absolute one keeps the name it was given."""
        return self.workspace.directory(path or ".", self.home())

    def command_env(self, request: dict[str, str] | None) -> dict[str, str]:
        """The environment of a process of the user: the allow-list, never os.environ."""
        return build_env(
            workspace=self.workspace.root,
            inherit=self.config.inherit_env,
            source=self._environ,
            defaults=self.guard.default_env,
            request=request,
        )

    def command_place(self, req: schemas.ExecRequest) -> tuple[str, dict[str, str]]:
        """A command's working directory (checked beneath the workspace) and environment."""
        if req.env:
            validate_env(req.env)
        return self.directory(req.cwd), self.command_env(req.env)

    def command_spec(self, req: schemas.ExecRequest) -> CommandSpec:
        cwd, env = self.command_place(req)
        return CommandSpec(
            argv=req.argv(),
            cwd=cwd,
            env=env,
            timeout_s=req.timeout_s,
            stdin=req.stdin.encode() if req.stdin is not None else None,
            max_output_bytes=req.max_output_bytes,
        )


def _daemon(request: Request) -> Daemon:
    return request.app.state.daemon


async def health(request: Request) -> Response:
    d = _daemon(request)
    return JSONResponse(
        {
            "status": "ok",
            "initialized": d.guard.initialized,
            "version": __version__,
            "uptime_s": round(time.monotonic() - d.started, 3),
        }
    )


async def init(request: Request) -> Response:
    body = await read_body(request, JSON_BODY.limit)
    req = schemas.parse(schemas.InitRequest, body)
    _daemon(request).guard.initialize(req.token)
    return JSONResponse({"status": "initialized"})


async def put_env(request: Request) -> Response:
    """Replaces the sandbox's default env for later commands: the manager's, when a live
    egress change brings or takes away the proxy variables (SPEC §11). Outside /v1, so the
    router's relay of /v1 calls cannot reach it; the token is the session key's, as any."""
    env = json_of(request, schemas.DefaultEnv).env
    validate_env(env, field="env")
    _daemon(request).guard.default_env = dict(env)
    return Response(status_code=204)


async def exposed_port(request: Request) -> Response:
    """SPEC §11: relayed to 127.0.0.1:{port}, the cell's own loopback."""
    from sandcell.network import ports  # h11 loads on the first relayed request only

    body = call_of(request).body
    assert body is not None
    return await ports.relay(request, body)


async def exposed_port_websocket(websocket: WebSocket) -> None:
    """SPEC §11: a WebSocket to 127.0.0.1:{port}, the upgrade signed like any GET."""
    from sandcell.network import ports

    await ports.relay_websocket(websocket)


@functools.cache
def _document() -> dict[str, Any]:
    # Built when first asked for: routers rarely ask, every cell start would pay for it.
    return openapi("sandcell daemon", __version__, OPERATIONS)


async def openapi_document(_: Request) -> Response:
    return JSONResponse(_document())


OPERATIONS = (
    Operation(
        "GET", "/health", health, "Liveness and init state", response=schemas.Health, secured=False
    ),
    Operation(
        "POST",
        "/init",
        init,
        "Second-stage init: install the session key",
        body=schemas.InitRequest,
        response=schemas.InitResponse,
        errors=(403, 409, 413, 429),
        secured=False,
    ),
    Operation(
        "PUT",
        "/env",
        put_env,
        "Replace the default env of later commands (the manager's)",
        body=schemas.DefaultEnv,
        status=204,
        errors=(400, 413, 503),
    ),
    *(
        DaemonOperation(
            method,
            "/v1/ports/{port}/{path:path}",
            exposed_port,
            "Relayed to 127.0.0.1:{port} in the cell",
            errors=(400, 401, 413, 502),
            reads=JSON_BODY,  # relayed whole, bound to the token
        )
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH")
    ),
    *EXEC_OPERATIONS,
    *FILE_OPERATIONS,
    *CELL_FILE_OPERATIONS,
    *process_routes.OPERATIONS,
    Operation("GET", "/openapi.json", openapi_document, "This document", secured=False),
    *CODE_OPERATIONS,
)


WEBSOCKETS = (
    WebSocketOperation("/v1/ports/{port}/{path:path}", exposed_port_websocket, bound=True),
    process_routes.ATTACH,
)


def create_app(config: DaemonConfig, environ: dict[str, str] | None = None) -> Starlette:
    app = Starlette(
        routes=routes(OPERATIONS, WEBSOCKETS),
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[Middleware(TracedSteps)],  # SPEC §20: a traced call's steps, handed back
    )
    app.state.daemon = Daemon(config, dict(os.environ) if environ is None else environ)
    return app
