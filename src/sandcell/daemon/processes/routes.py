"""The daemon's routes for background processes (SPEC §9), wired into `app.OPERATIONS`."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.cellapi import processes as schemas
from sandcell.cellapi.processes import TerminalSize
from sandcell.daemon.http.steps import step
from sandcell.daemon.http.table import Body, DaemonOperation, WebSocketOperation, call_of, json_of
from sandcell.daemon.processes.attach import attach
from sandcell.daemon.processes.outputlog import Chunk, parse_offset
from sandcell.daemon.processes.table import Launch, Process, parse_signal
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.openapi import Operation, Query

if TYPE_CHECKING:
    from sandcell.daemon.http.app import Daemon

MAX_STDIN_BODY = 8 * 1_048_576
NDJSON = "application/x-ndjson"
_PID = "/v1/processes/{pid}"


def _daemon(request: Request) -> Daemon:
    return request.app.state.daemon


def _process(request: Request) -> Process:
    return _daemon(request).processes.get(request.path_params["pid"])


async def start_process(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.StartProcess)
    follow = _follow(request)
    cwd, env = d.command_place(req)
    launch = Launch(
        command=req.command,
        argv=req.argv(),
        cwd=cwd,
        cwd_shown=req.cwd or ".",
        env=env,
        timeout_s=req.timeout_s,
        stdin=req.stdin,
        pty=(req.pty.cols, req.pty.rows) if req.pty else None,
        tag=req.tag,
        buffer_bytes=req.max_buffer_bytes,
    )
    with step("process.spawn") as outcome:
        process = await d.processes.start(launch)
        outcome["pid"] = process.pid
    if follow:  # started and followed in one call (the E2B façade's Start)
        return StreamingResponse(_started(process), status_code=201, media_type=NDJSON)
    return JSONResponse(process.info(), status_code=201)


async def _started(process: Process) -> AsyncIterator[bytes]:
    """The process, then its output as `GET .../output?follow=true` gives it."""
    yield _line({"type": "process", **process.info()})
    async for line in _output_lines(process, 0, True):
        yield line


async def list_processes(request: Request) -> Response:
    return JSONResponse({"processes": _daemon(request).processes.list()})


async def get_process(request: Request) -> Response:
    return JSONResponse(_process(request).info())


async def process_output(request: Request) -> Response:
    offset = parse_offset(request.query_params.get("offset", "0"))
    lines = _output_lines(_process(request), offset, _follow(request))
    return StreamingResponse(lines, media_type=NDJSON)


def _follow(request: Request) -> bool:
    follow = request.query_params.get("follow", "false").lower()
    if follow not in ("true", "false", "1", "0"):
        raise ServiceError(ErrorCode.BAD_REQUEST, "follow must be true or false")
    return follow in ("true", "1")


async def _output_lines(process: Process, offset: int, follow: bool) -> AsyncIterator[bytes]:
    async for item in process.log.follow(offset, follow):
        if isinstance(item, Chunk):
            data = base64.b64encode(item.data).decode()
            yield _line({"type": item.stream, "data_b64": data, "offset": item.offset})
        else:
            yield _line({"type": "lost", "bytes": item.bytes})
    if process.exit is not None and (follow or process.log.closed):
        yield _line({"type": "exit", **process.exit})


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


async def write_stdin(request: Request) -> Response:
    body = call_of(request).body
    assert body is not None
    await _process(request).write_stdin(body)
    return Response(status_code=204)


async def close_stdin(request: Request) -> Response:
    await _process(request).close_stdin()
    return Response(status_code=204)


async def signal_process(request: Request) -> Response:
    req = json_of(request, schemas.SignalRequest)
    _process(request).send_signal(parse_signal(req.signal))
    return Response(status_code=204)


async def resize_process(request: Request) -> Response:
    req = json_of(request, TerminalSize)
    _process(request).resize(req.cols, req.rows)
    return Response(status_code=204)


async def kill_process(request: Request) -> Response:
    _process(request).kill()
    return Response(status_code=204)


ATTACH = WebSocketOperation(f"{_PID}/ws", attach)
OPERATIONS = (
    Operation(
        "POST",
        "/v1/processes",
        start_process,
        "Start a process in the background (with follow=true, answer it as an NDJSON line "
        "of type process, then its output as GET .../output?follow=true gives it)",
        body=schemas.StartProcess,
        response=schemas.ProcessInfo,
        query=(Query("follow", {"type": "boolean"}),),
        status=201,
        errors=(403, 404, 413, 429, 503),
    ),
    Operation(
        "GET",
        "/v1/processes",
        list_processes,
        "Running processes and the last exited ones",
        response=schemas.ProcessList,
        errors=(503,),
    ),
    Operation(
        "GET",
        _PID,
        get_process,
        "Describe a process",
        response=schemas.ProcessInfo,
        errors=(404, 503),
    ),
    Operation(
        "GET",
        f"{_PID}/output",
        process_output,
        "Replay (and follow) a process's output as NDJSON",
        response=NDJSON,
        query=(
            Query("offset", {"type": "integer", "minimum": 0}),
            Query("follow", {"type": "boolean"}),
        ),
        errors=(404, 503),
    ),
    DaemonOperation(
        "POST",
        f"{_PID}/stdin",
        write_stdin,
        "Write the raw body to the process's stdin (or terminal)",
        body="application/octet-stream",
        status=204,
        errors=(404, 409, 413, 503),
        reads=Body(MAX_STDIN_BODY, bound=False),  # checked against `bsh` when it has one
    ),
    Operation(
        "POST",
        f"{_PID}/stdin/close",
        close_stdin,
        "Close stdin (EOF)",
        status=204,
        errors=(404, 409, 503),
    ),
    Operation(
        "POST",
        f"{_PID}/signal",
        signal_process,
        "Signal the process's group",
        body=schemas.SignalRequest,
        status=204,
        errors=(404, 409, 503),
    ),
    Operation(
        "POST",
        f"{_PID}/resize",
        resize_process,
        "Resize the process's terminal",
        body=TerminalSize,
        status=204,
        errors=(404, 409, 503),
    ),
    Operation(
        "DELETE",
        _PID,
        kill_process,
        "Kill the process and all its descendants",
        status=204,
        errors=(404, 503),
    ),
)
