"""`POST /v1/exec` (SPEC §2.2), wired into the daemon's operation table."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sandcell.cellapi import schemas
from sandcell.daemon.exec.stream import exec_stream
from sandcell.daemon.http.steps import step
from sandcell.daemon.http.table import json_of
from sandcell.http.openapi import Operation

if TYPE_CHECKING:
    from sandcell.daemon.http.app import Daemon

NDJSON = "application/x-ndjson"
BUFFERED_RESULT_BYTES = 1_048_576


def _daemon(request: Request) -> Daemon:
    return request.app.state.daemon


async def exec_command(request: Request) -> Response:
    d = _daemon(request)
    spec = d.command_spec(json_of(request, schemas.ExecRequest))
    if NDJSON in request.headers.get("accept", ""):
        return StreamingResponse(exec_stream(d.runner, spec), media_type=NDJSON)
    with step("exec.run") as outcome:
        result = await d.runner.run(spec)
        outcome["exit_code"], outcome["timed_out"] = result.exit_code, result.timed_out
    if result.stdout.size + result.stderr.size <= BUFFERED_RESULT_BYTES:
        # The common small result: one body, one write (streaming costs ~1 ms a call).
        return Response(b"".join(result.iter_json()), media_type="application/json")
    return StreamingResponse(_in_loop(result.iter_json()), media_type="application/json")


async def _in_loop(pieces: Iterable[bytes]) -> AsyncIterator[bytes]:
    """Starlette runs a plain iterator in a worker thread: a cell out of pids (a fork bomb
    at pids_max) could then not even answer. Encoding JSON is CPU work: stay in the loop."""
    for piece in pieces:
        yield piece


EXEC_OPERATIONS = (
    Operation(
        "POST",
        "/v1/exec",
        exec_command,
        "Run a command (NDJSON with Accept)",
        body=schemas.ExecRequest,
        response=schemas.ExecResult,
        errors=(403, 404, 413, 503),
    ),
)
