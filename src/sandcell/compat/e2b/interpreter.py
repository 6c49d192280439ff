"""The code interpreter E2B serves on port 49999 (`/execute`, `/contexts`), on sandcell's code
contexts (SPEC §10): the same IPython-backed contexts, its NDJSON lines renamed to E2B's.
The handlers are envd's kind (the sandbox's token opens them): see envd/app.py's table."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.gateway import Gateway, ndjson
from sandcell.compat.e2b.paths import CELL_WORKSPACE, to_e2b, to_workspace
from sandcell.errors import ServiceError
from sandcell.http.hop import check_path
from sandcell.router.core import Answer
from sandcell.store import SandboxRecord

MAX_BODY = 8 * 1_048_576
DEFAULT_TIMEOUT_S = 300
# sandcell's MIME bundle keys -> the keyword names of e2b_code_interpreter's Result.
MIME_NAMES = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/json": "json",
    "text/latex": "latex",
    "application/pdf": "pdf",
    "application/javascript": "javascript",
    "e2b/chart": "chart",
    "is_main_result": "is_main_result",
}


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _translate(line: dict[str, Any]) -> dict[str, Any] | None:
    kind = line.get("type")
    if kind in ("stdout", "stderr"):
        return {"type": kind, "text": line.get("text", ""), "timestamp": int(time.time() * 1e9)}
    if kind == "result":
        bundle = {MIME_NAMES[k]: v for k, v in line.items() if k in MIME_NAMES}
        return {"type": "result", **bundle}
    if kind == "error":
        return {"type": "error", **{k: line.get(k, "") for k in ("name", "value", "traceback")}}
    if kind == "end":
        return {"type": "number_of_executions", "execution_count": line.get("execution_count")}
    return None


async def _execute_lines(response: Answer) -> AsyncIterator[bytes]:
    """The run's lines in E2B's names; a run cut short ends with an error line (the status
    went out with the first line)."""
    try:
        async for line in ndjson(response):
            if (translated := _translate(line)) is not None:
                yield _line(translated)
    except ServiceError as exc:
        yield _line(
            {"type": "error", "name": "SandboxError", "value": exc.message, "traceback": ""}
        )


async def execute(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    body = await json_body(request, MAX_BODY)
    run = {
        "code": body.get("code"),
        "language": body.get("language") or "python",
        "context_id": body.get("context_id"),
        "env": body.get("env_vars") or {},
        "timeout_s": DEFAULT_TIMEOUT_S,
    }
    if body.get("context_id"):
        run.pop("language")
    response = await gateway.daemon(
        record,
        "POST",
        "code/run",
        body=json.dumps(run).encode(),
        headers={"accept": "application/x-ndjson", "content-type": "application/json"},
    )
    return StreamingResponse(_execute_lines(response), media_type="application/x-ndjson")


def _context(view: dict[str, Any]) -> dict[str, Any]:
    cwd = view.get("cwd", "")
    if cwd == CELL_WORKSPACE or cwd.startswith(CELL_WORKSPACE + "/"):
        cwd = to_e2b(cwd[len(CELL_WORKSPACE) :])
    return {"id": view["id"], "language": view["language"], "cwd": cwd}


async def create_context(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    body = await json_body(request, MAX_BODY)
    create = {"language": body.get("language") or "python", "cwd": to_workspace(body.get("cwd"))}
    response = await gateway.daemon(
        record, "POST", "code/contexts", body=json.dumps(create).encode()
    )
    return JSONResponse(_context(await response.json()))


async def list_contexts(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    listed = await gateway.json(record, "GET", "code/contexts")
    return JSONResponse([_context(c) for c in listed["contexts"]])


async def remove_context(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    context_id = check_path(request.path_params["context_id"])
    await gateway.daemon(record, "DELETE", f"code/contexts/{context_id}")
    return Response(status_code=204)


async def restart_context(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    context_id = check_path(request.path_params["context_id"])
    await gateway.daemon(record, "POST", f"code/contexts/{context_id}/restart")
    return Response(status_code=204)


class ExecuteRequest(BaseModel):
    """What `/execute` reads of e2b_code_interpreter's request."""

    model_config = ConfigDict(extra="allow")
    code: str
    language: str | None = None
    context_id: str | None = None
    env_vars: dict[str, str] | None = None


class CreateContext(BaseModel):
    model_config = ConfigDict(extra="allow")
    language: str | None = None
    cwd: str | None = None
