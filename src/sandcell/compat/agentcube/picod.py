"""PicoD's API (agentcube's in-sandbox daemon) in terms of sandcell's daemon API.

- `POST api/execute` `{command: [argv] or str, timeout: "30s", working_dir, env}`:
  `POST /v1/exec`, answered `{stdout, stderr, exit_code, duration, start_time, end_time}`
- `POST api/files`, JSON `{path, content: base64, mode}` or multipart (`path`, `file`):
  `PUT /v1/files?path=`, answered `{path, size, mode, modified}`. A form is read as it
  arrives (`sandcell.http.multipart`), its file streamed on to the daemon once `path` is
  known (a `file` sent before `path` is held, bounded, until it comes)
- `GET api/files?path=D`: `GET /v1/files/list`, answered `{files: [{name, size, modified,
  mode, is_dir}]}`
- `GET api/files/<path>`: `GET /v1/files?path=`, the bytes streamed
- `GET health`: the session lookup itself

`mode` is not applied: sandcell writes files 0644 (run scripts with their interpreter).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.cellapi.limits import MAX_JSON_BODY, MAX_TIMEOUT_S
from sandcell.compat.agentcube import daemon
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import (
    BODY_BUDGET,
    BodyBudget,
    parse_model,
    read_body,
    stream_body,
    too_large,
)
from sandcell.http.multipart import FormLimits, FormReader, Part, drain
from sandcell.router.core import Call
from sandcell.store import SandboxRecord

MAX_UPLOAD_BODY = 64 * 1_048_576
# PicoD's form has `path`, `file` and `mode`; a few more parts are skipped, not hundreds.
FORM = FormLimits(max_parts=16, max_field_bytes=4_096)
DEFAULT_TIMEOUT_S = 30.0
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ExecuteRequest(BaseModel):
    command: list[str] | str = Field(min_length=1)
    timeout: str | float | None = None
    working_dir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class UploadRequest(BaseModel):
    path: str = Field(min_length=1)
    content: str
    mode: str | None = None


def go_duration_s(value: str | float | None) -> float:
    """Seconds of a Go duration ("30s", "1m30s", "500ms") or a number of seconds."""
    if value is None or value == "":
        return DEFAULT_TIMEOUT_S
    if isinstance(value, int | float):
        seconds = float(value)
    elif value and _GO_DURATION.sub("", value) == "":
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _GO_DURATION.findall(value))
    else:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"invalid timeout {value!r}")
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"timeout must be in (0, {MAX_TIMEOUT_S:g}] s")
    return seconds


async def execute(request: Request, record: SandboxRecord, _: str) -> Response:
    req = parse_model(ExecuteRequest, await read_body(request, MAX_JSON_BODY))
    timeout_s = go_duration_s(req.timeout)
    body = {"command": req.command, "timeout_s": timeout_s, "env": req.env}
    if req.working_dir:
        body["cwd"] = req.working_dir
    started = datetime.now(UTC)
    exec_body = json.dumps(body).encode()
    result = await daemon.json_of(
        request, record, "POST", "/v1/exec", exec_body, "application/json"
    )
    stderr = result["stderr"]
    if result.get("timed_out"):  # PicoD's words, which agentcube users may match on
        stderr += f"Command timed out after {timeout_s:.0f} seconds"
    duration = float(result.get("duration_s") or 0.0)
    return JSONResponse(
        {
            "stdout": result["stdout"],
            "stderr": stderr,
            "exit_code": result["exit_code"],
            "duration": duration,
            "start_time": started.isoformat(),
            "end_time": (started + timedelta(seconds=duration)).isoformat(),
        }
    )


async def upload(request: Request, record: SandboxRecord, _: str) -> Response:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        try:
            entry = await _form_upload(request, record, content_type)
        except ServiceError:
            await drain(request)
            raise
    else:
        req = parse_model(UploadRequest, await read_body(request, MAX_UPLOAD_BODY))
        target = _file_target(req.path)
        entry = await daemon.json_of(
            request, record, "PUT", target, _base64(req.content), "application/octet-stream"
        )
    return JSONResponse(_file_info(entry))


async def _form_upload(request: Request, record: SandboxRecord, content_type: str) -> Any:
    """The daemon's entry for the form's file, written at its `path` (the first of each
    field counts, as in PicoD's Go form parsing; other fields, `mode` too, are skipped)."""
    path: str | None = None
    held: bytes | None = None
    entry: Any = None
    async for part in FormReader(content_type, stream_body(request), FORM).parts():
        if part.name == "path" and path is None:
            path = await part.text()
            if not path:
                raise ServiceError(ErrorCode.BAD_REQUEST, "missing 'path' field")
        elif part.name == "file" and entry is None and held is None:
            if path is None:
                held = await _held(request, part)
            else:
                entry = await _put(request, record, path, part.chunks())
    if path is None or (entry is None and held is None):
        raise ServiceError(ErrorCode.BAD_REQUEST, "a multipart upload needs 'path' and 'file'")
    if entry is None and held is not None:
        target = _file_target(path)
        entry = await daemon.json_of(
            request, record, "PUT", target, held, "application/octet-stream"
        )
    return entry


async def _held(request: Request, part: Part) -> bytes:
    """A file part that came before `path`: held until it does, bounded as a JSON upload's
    body is and paid for from the caller's byte budget in the same way."""
    budget: BodyBudget | None = request.scope.get(BODY_BUDGET)
    data = bytearray()
    async for chunk in part.chunks():
        data += chunk
        if len(data) > MAX_UPLOAD_BODY:
            raise too_large(MAX_UPLOAD_BODY)
        if budget is not None:
            budget.cover(len(data))
    return bytes(data)


async def _put(
    request: Request, record: SandboxRecord, path: str, chunks: AsyncIterator[bytes]
) -> Any:
    """The file written from `chunks` as they arrive: a streamed `Call` through the router
    core (`daemon.call` sends whole bodies only), bounded by the daemon's disk quota."""
    headers = [(b"content-type", b"application/octet-stream")]
    call = Call("PUT", _file_target(path), headers, None, chunks)
    return await (await request.app.state.router.send(record, call)).json()


def _base64(content: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ServiceError(ErrorCode.BAD_REQUEST, "content is not valid base64") from None


async def list_files(request: Request, record: SandboxRecord, _: str) -> Response:
    path = request.query_params.get("path", "")
    if not path:
        raise ServiceError(ErrorCode.BAD_REQUEST, "missing 'path' query parameter")
    target = f"/v1/files/list?path={quote(path, safe='')}&depth=1"
    listing = await daemon.json_of(request, record, "GET", target)
    files = [
        {
            "name": e["name"],
            "size": e["size"],
            "modified": e["modified"],
            "mode": _go_mode(e),
            "is_dir": e["type"] == "dir",
        }
        for e in listing["entries"]
    ]
    return JSONResponse({"files": files})


async def download(request: Request, record: SandboxRecord, path: str) -> Response:
    """The file's bytes, streamed from the daemon as they come."""
    remote = path.removeprefix("api/files/").lstrip("/")
    if not remote:
        raise ServiceError(ErrorCode.BAD_REQUEST, "missing file path")
    return await daemon.relayed(request, record, "GET", _file_target(remote))


async def health(request: Request, record: SandboxRecord, _: str) -> Response:
    return JSONResponse({"status": "ok", "sandbox_id": record.id})


def _file_target(path: str) -> str:
    return f"/v1/files?path={quote(path, safe='')}"


def _file_info(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "path": entry["path"],
        "size": entry["size"],
        "mode": _go_mode(entry),
        "modified": entry["modified"],
    }


def _go_mode(entry: dict[str, Any]) -> str:
    """Go's `FileMode.String()` ("-rw-r--r--", "drwxr-xr-x"), which PicoD reports."""
    kinds = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}
    mode = stat.filemode(int(entry["mode"], 8) | kinds.get(entry["type"], stat.S_IFREG))
    return "L" + mode[1:] if entry["type"] == "symlink" else mode
