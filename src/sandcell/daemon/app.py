"""The daemon's HTTP API (SPEC §2): health, init, exec and files, behind the guard."""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.websockets import WebSocket

from sandcell import __version__
from sandcell.cellapi import schemas
from sandcell.cellapi.environment import build_env, validate_env
from sandcell.daemon import process_api
from sandcell.daemon.auth import Guard
from sandcell.daemon.code.contexts import Contexts
from sandcell.daemon.code.routes import CODE_OPERATIONS
from sandcell.daemon.config import DaemonConfig
from sandcell.daemon.exec_stream import exec_stream
from sandcell.daemon.files import Files
from sandcell.daemon.proctable import ProcessTable
from sandcell.daemon.runner import CommandSpec, Runner
from sandcell.daemon.table import (
    JSON_BODY,
    DaemonOperation,
    WebSocketOperation,
    call_of,
    json_of,
    routes,
)
from sandcell.daemon.workspace import Workspace
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import declared_length, read_body, stream_body
from sandcell.http.errors import EXCEPTION_HANDLERS
from sandcell.http.openapi import Operation, Query, openapi

NDJSON = "application/x-ndjson"
BUFFERED_RESULT_BYTES = 1_048_576
_PATH = Query("path", {"type": "string"}, required=True, description="workspace-relative")


class Daemon:
    """State of one daemon: its guard, workspace and running commands."""

    def __init__(self, config: DaemonConfig, environ: dict[str, str]) -> None:
        self.config = config
        self.guard = Guard(config.sandbox_id, config.bootstrap_key)
        self.workspace = Workspace(config.workspace)
        self.files = Files(self.workspace, config.disk_quota_bytes)
        self.runner = Runner()
        self.processes = ProcessTable(self.runner)
        self.contexts = Contexts(config.code_python, lambda: self.command_env(None), self.runner)
        self.started = time.monotonic()
        # A snapshot: commands read the allow-listed names from it, never os.environ itself.
        self._environ = dict(environ)

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
        return self.workspace.directory(req.cwd or "."), self.command_env(req.env)

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


def _query(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        raise SandcellError(ErrorCode.BAD_REQUEST, f"missing query parameter {name!r}")
    return value


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise SandcellError(ErrorCode.BAD_REQUEST, f"{name} must be true or false")
    return value in ("true", "1")


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


async def exec_command(request: Request) -> Response:
    d = _daemon(request)
    spec = d.command_spec(json_of(request, schemas.ExecRequest))
    if NDJSON in request.headers.get("accept", ""):
        return StreamingResponse(exec_stream(d.runner, spec), media_type=NDJSON)
    result = await d.runner.run(spec)
    if result.stdout.size + result.stderr.size <= BUFFERED_RESULT_BYTES:
        # The common small result: one body, one write (streaming costs ~1 ms a call).
        return Response(b"".join(result.iter_json()), media_type="application/json")
    return StreamingResponse(_in_loop(result.iter_json()), media_type="application/json")


async def _in_loop(pieces: Iterable[bytes]) -> AsyncIterator[bytes]:
    """Starlette runs a plain iterator in a worker thread: a cell out of pids (a fork bomb
    at pids_max) could then not even answer. Encoding JSON is CPU work: stay in the loop."""
    for piece in pieces:
        yield piece


async def write_file(request: Request) -> Response:
    d = _daemon(request)
    verified = call_of(request).token
    path = _query(request, "path")
    length = declared_length(request)
    if "bsh" not in verified.claims:  # a streamed upload: no digest to hold it against
        return JSONResponse(await d.files.write(path, stream_body(request), length))
    digest = hashlib.sha256()

    async def hashed() -> AsyncIterator[bytes]:
        async for chunk in stream_body(request):
            digest.update(chunk)
            yield chunk

    def check_body() -> None:
        # Streamed uploads are hashed on the fly; a bound body must match before commit.
        d.guard.check_streamed_body(verified, digest.digest())

    entry = await d.files.write(path, hashed(), length, check_body)
    return JSONResponse(entry)


async def read_file(request: Request) -> Response:
    d = _daemon(request)
    fd, size = d.files.open_for_read(_query(request, "path"))
    return StreamingResponse(
        d.files.iter_fd(fd),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )


async def delete_file(request: Request) -> Response:
    d = _daemon(request)
    d.files.remove(_query(request, "path"), _flag(request, "recursive"))
    return Response(status_code=204)


async def list_files(request: Request) -> Response:
    d = _daemon(request)
    raw_depth = request.query_params.get("depth", "1")
    if not (raw_depth.isascii() and raw_depth.isdigit()):  # int() refuses "³", isdigit not
        raise SandcellError(ErrorCode.BAD_REQUEST, "depth must be a positive integer")
    entries = d.files.list(request.query_params.get("path", "."), int(raw_depth))
    return JSONResponse({"entries": entries})


async def stat_file(request: Request) -> Response:
    d = _daemon(request)
    return JSONResponse(d.files.stat(_query(request, "path")))


async def put_env(request: Request) -> Response:
    """Replaces the sandbox's default env for later commands: the manager's, when a live
    egress change brings or takes away the proxy variables (SPEC §11). Outside /v1, so the
    router's relay of /v1 calls cannot reach it; the token is the session key's, as any."""
    env = json_of(request, schemas.DefaultEnv).env
    validate_env(env, field="env")
    _daemon(request).guard.default_env = dict(env)
    return Response(status_code=204)


async def make_dir(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.MkdirRequest)
    return JSONResponse(d.files.mkdir(req.path, req.parents))


async def move_file(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.MoveRequest)
    return JSONResponse(d.files.move(req.source, req.to, req.overwrite))


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


OCTETS = "application/octet-stream"
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
    Operation(
        "POST",
        "/v1/exec",
        exec_command,
        "Run a command (NDJSON with Accept)",
        body=schemas.ExecRequest,
        response=schemas.ExecResult,
        errors=(403, 404, 413, 503),
    ),
    Operation(
        "PUT",
        "/v1/files",
        write_file,
        "Write the request body to a file",
        body=OCTETS,
        response=schemas.Entry,
        query=(_PATH,),
        errors=(403, 404, 409, 413, 503),
    ),
    Operation(
        "GET",
        "/v1/files",
        read_file,
        "Read a file's bytes",
        response=OCTETS,
        query=(_PATH,),
        errors=(403, 404, 503),
    ),
    Operation(
        "DELETE",
        "/v1/files",
        delete_file,
        "Delete a file or directory",
        status=204,
        query=(_PATH, Query("recursive", {"type": "boolean"})),
        errors=(403, 404, 409, 503),
    ),
    Operation(
        "GET",
        "/v1/files/list",
        list_files,
        "List a directory",
        response=schemas.EntryList,
        query=(
            Query("path", {"type": "string"}),
            Query("depth", {"type": "integer", "minimum": 1, "maximum": 32}),
        ),
        errors=(403, 404, 503),
    ),
    Operation(
        "GET",
        "/v1/files/stat",
        stat_file,
        "Describe one path",
        response=schemas.Entry,
        query=(_PATH,),
        errors=(403, 404, 503),
    ),
    Operation(
        "POST",
        "/v1/files/mkdir",
        make_dir,
        "Create a directory",
        body=schemas.MkdirRequest,
        response=schemas.Entry,
        errors=(403, 404, 409, 503),
    ),
    Operation(
        "POST",
        "/v1/files/move",
        move_file,
        "Move or rename",
        body=schemas.MoveRequest,
        response=schemas.Entry,
        errors=(403, 404, 409, 503),
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
    *process_api.OPERATIONS,
    Operation("GET", "/openapi.json", openapi_document, "This document", secured=False),
    *CODE_OPERATIONS,
)


WEBSOCKETS = (
    WebSocketOperation("/v1/ports/{port}/{path:path}", exposed_port_websocket, bound=True),
    process_api.ATTACH,
)


def create_app(config: DaemonConfig, environ: dict[str, str] | None = None) -> Starlette:
    app = Starlette(routes=routes(OPERATIONS, WEBSOCKETS), exception_handlers=EXCEPTION_HANDLERS)
    app.state.daemon = Daemon(config, dict(os.environ) if environ is None else environ)
    return app
