"""The code interpreter's routes (SPEC §10), appended to the daemon's operation table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.cellapi import schemas
from sandcell.cellapi.environment import validate_env
from sandcell.daemon.code.results import RunOutput
from sandcell.daemon.http.table import Body, DaemonOperation, json_of
from sandcell.http import ndjson
from sandcell.http.openapi import Operation

if TYPE_CHECKING:
    from sandcell.daemon.http.app import Daemon

NDJSON = "application/x-ndjson"
MAX_EMPTY_BODY = 4096


def _daemon(request: Request) -> Daemon:
    return request.app.state.daemon


async def run_code(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.CodeRunRequest)
    env = req.env or {}
    validate_env(env)
    language = req.language or ("python" if req.context_id is None else None)
    context = d.contexts.for_run(language, req.context_id, d.home())
    frame = context.frame(req.code, env)
    await context.prepare()  # a context that cannot start is a 4xx, before any streaming

    async def run(emit: ndjson.Emit | None) -> ndjson.Event:
        output = RunOutput(emit, req.max_output_bytes)
        summary = await context.run(frame, req.timeout_s, output)
        return {"type": "end", **summary} if emit else output.reply(summary)

    if NDJSON in request.headers.get("accept", ""):
        return StreamingResponse(ndjson.event_stream(run), media_type=NDJSON)
    return Response(ndjson.line(await run(None)), media_type="application/json")


async def create_context(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.CodeContextRequest)
    language = d.contexts.language(req.language)  # an unknown language is a 400 first
    context = d.contexts.create(language.name, d.directory(req.cwd))
    return JSONResponse(context.view(), status_code=201)


async def list_contexts(request: Request) -> Response:
    return JSONResponse({"contexts": _daemon(request).contexts.list()})


async def restart_context(request: Request) -> Response:
    _daemon(request).contexts.get(request.path_params["context_id"]).restart()
    return Response(status_code=204)


async def delete_context(request: Request) -> Response:
    _daemon(request).contexts.remove(request.path_params["context_id"])
    return Response(status_code=204)


CODE_OPERATIONS = (
    Operation(
        "POST",
        "/v1/code/run",
        run_code,
        "Run code in a context (NDJSON with Accept)",
        body=schemas.CodeRunRequest,
        response=schemas.CodeRunResult,
        errors=(403, 404, 413, 429, 503),
    ),
    Operation(
        "POST",
        "/v1/code/contexts",
        create_context,
        "Create a code context (its process starts with its first run)",
        body=schemas.CodeContextRequest,
        response=schemas.CodeContext,
        status=201,
        errors=(403, 404, 413, 429, 503),
    ),
    Operation(
        "GET",
        "/v1/code/contexts",
        list_contexts,
        "List code contexts",
        response=schemas.CodeContextList,
        errors=(503,),
    ),
    DaemonOperation(
        "POST",
        "/v1/code/contexts/{context_id}/restart",
        restart_context,
        "Restart a context: fresh state",
        status=204,
        errors=(404, 503),
        reads=Body(MAX_EMPTY_BODY, bound=True),  # no body, but the token binds its emptiness
    ),
    Operation(
        "DELETE",
        "/v1/code/contexts/{context_id}",
        delete_context,
        "Delete a context and its process",
        status=204,
        errors=(404, 503),
    ),
)
