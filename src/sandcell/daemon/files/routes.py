"""The file API's routes (SPEC §2.4), wired into the daemon's operation table."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.cellapi import schemas
from sandcell.daemon.http.table import call_of, json_of
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import declared_length, stream_body
from sandcell.http.openapi import Operation, Query

if TYPE_CHECKING:
    from sandcell.daemon.http.app import Daemon

OCTETS = "application/octet-stream"
_PATH = Query("path", {"type": "string"}, required=True, description="workspace-relative")


def _daemon(request: Request) -> Daemon:
    return request.app.state.daemon


def _query(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"missing query parameter {name!r}")
    return value


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise ServiceError(ErrorCode.BAD_REQUEST, f"{name} must be true or false")
    return value in ("true", "1")


def _metadata(request: Request) -> dict[str, str] | None:
    """`metadata`: a JSON object of strings, each kept as a `user.<key>` xattr (part of the
    signed target, like every query parameter)."""
    raw = request.query_params.get("metadata")
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ServiceError(ErrorCode.BAD_REQUEST, "metadata must be a JSON object") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and "\0" not in k and isinstance(v, str) and "\0" not in v
        for k, v in value.items()
    ):
        raise ServiceError(ErrorCode.BAD_REQUEST, "metadata must map names to strings")
    return value


async def write_file(request: Request) -> Response:
    d = _daemon(request)
    verified = call_of(request).token
    path = _query(request, "path")
    length = declared_length(request)
    metadata = _metadata(request)
    if "bsh" not in verified.claims:  # a streamed upload: no digest to hold it against
        return JSONResponse(
            await d.files.write(path, stream_body(request), length, metadata=metadata)
        )
    digest = hashlib.sha256()

    async def hashed() -> AsyncIterator[bytes]:
        async for chunk in stream_body(request):
            digest.update(chunk)
            yield chunk

    def check_body() -> None:
        # Streamed uploads are hashed on the fly; a bound body must match before commit.
        d.guard.check_streamed_body(verified, digest.digest())

    entry = await d.files.write(path, hashed(), length, check_body, metadata)
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
        raise ServiceError(ErrorCode.BAD_REQUEST, "depth must be a positive integer")
    entries = d.files.list(request.query_params.get("path", "."), int(raw_depth))
    return JSONResponse({"entries": entries})


async def stat_file(request: Request) -> Response:
    d = _daemon(request)
    return JSONResponse(d.files.stat(_query(request, "path")))


async def make_dir(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.MkdirRequest)
    return JSONResponse(d.files.mkdir(req.path, req.parents))


async def move_file(request: Request) -> Response:
    d = _daemon(request)
    req = json_of(request, schemas.MoveRequest)
    return JSONResponse(d.files.move(req.source, req.to, req.overwrite))


FILE_OPERATIONS = (
    Operation(
        "PUT",
        "/v1/files",
        write_file,
        "Write the request body to a file",
        body=OCTETS,
        response=schemas.Entry,
        query=(
            _PATH,
            Query(
                "metadata",
                {"type": "string"},
                description="a JSON object of strings, kept as user.<key> xattrs",
            ),
        ),
        errors=(400, 403, 404, 409, 413, 501, 503),
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
)
