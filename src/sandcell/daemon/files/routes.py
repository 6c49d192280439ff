"""The file API's routes, wired into the daemon's operation table: `/v1/files` on the
workspace (SPEC §2.4), and the same operations at `/cell/files` on the workspace and the
cell's /tmp (§14.2). The second table is outside /v1, as `/env` is: the router relays users'
calls to /v1 only, so only host-side façades (E2B's) reach it, through the router core."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.cellapi import schemas
from sandcell.daemon.http.steps import step
from sandcell.daemon.http.table import call_of, json_of
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import declared_length, stream_body
from sandcell.http.openapi import Endpoint, Operation, Query

if TYPE_CHECKING:
    from sandcell.daemon.files.operations import EntryRecord, Files
    from sandcell.daemon.http.app import Daemon

Handler = Callable[["Files", Request], Awaitable[Response]]

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


async def write_file(files: Files, request: Request) -> Response:
    with step("file.write") as outcome:
        entry = await _written(files, request)
        outcome["bytes"] = entry["size"]
    return JSONResponse(entry)


async def _written(files: Files, request: Request) -> EntryRecord:
    d = _daemon(request)
    verified = call_of(request).token
    path = _query(request, "path")
    length = declared_length(request)
    metadata = _metadata(request)
    if "bsh" not in verified.claims:  # a streamed upload: no digest to hold it against
        return await files.write(path, stream_body(request), length, metadata=metadata)
    digest = hashlib.sha256()

    async def hashed() -> AsyncIterator[bytes]:
        async for chunk in stream_body(request):
            digest.update(chunk)
            yield chunk

    def check_body() -> None:
        # Streamed uploads are hashed on the fly; a bound body must match before commit.
        d.guard.check_streamed_body(verified, digest.digest())

    return await files.write(path, hashed(), length, check_body, metadata)


async def read_file(files: Files, request: Request) -> Response:
    with step("file.read") as outcome:  # the open: the bytes stream after the head
        fd, size = files.open_for_read(_query(request, "path"))
        outcome["bytes"] = size
    return StreamingResponse(
        files.iter_fd(fd),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )


async def delete_file(files: Files, request: Request) -> Response:
    files.remove(_query(request, "path"), _flag(request, "recursive"))
    return Response(status_code=204)


async def list_files(files: Files, request: Request) -> Response:
    raw_depth = request.query_params.get("depth", "1")
    if not (raw_depth.isascii() and raw_depth.isdigit()):  # int() refuses "³", isdigit not
        raise ServiceError(ErrorCode.BAD_REQUEST, "depth must be a positive integer")
    entries = files.list(request.query_params.get("path", "."), int(raw_depth))
    return JSONResponse({"entries": entries})


async def stat_file(files: Files, request: Request) -> Response:
    return JSONResponse(files.stat(_query(request, "path")))


async def make_dir(files: Files, request: Request) -> Response:
    req = json_of(request, schemas.MkdirRequest)
    return JSONResponse(files.mkdir(req.path, req.parents))


async def move_file(files: Files, request: Request) -> Response:
    req = json_of(request, schemas.MoveRequest)
    return JSONResponse(files.move(req.source, req.to, req.overwrite))


def _on(files_of: Callable[[Daemon], Files], handler: Handler, prefix: str) -> Endpoint:
    """`handler` on the `Files` that `files_of` picks of the request's daemon."""

    async def endpoint(request: Request) -> Response:
        return await handler(files_of(_daemon(request)), request)

    endpoint.__name__ = prefix + handler.__name__  # unique operation ids in the document
    return endpoint


def file_operations(
    base: str, files_of: Callable[[Daemon], Files], name_prefix: str = ""
) -> tuple[Operation, ...]:
    """The file operations at `base` ("/v1/files"), on the `Files` that `files_of` picks."""
    return (
        Operation(
            "PUT",
            base,
            _on(files_of, write_file, name_prefix),
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
            base,
            _on(files_of, read_file, name_prefix),
            "Read a file's bytes",
            response=OCTETS,
            query=(_PATH,),
            errors=(403, 404, 503),
        ),
        Operation(
            "DELETE",
            base,
            _on(files_of, delete_file, name_prefix),
            "Delete a file or directory",
            status=204,
            query=(_PATH, Query("recursive", {"type": "boolean"})),
            errors=(403, 404, 409, 503),
        ),
        Operation(
            "GET",
            f"{base}/list",
            _on(files_of, list_files, name_prefix),
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
            f"{base}/stat",
            _on(files_of, stat_file, name_prefix),
            "Describe one path",
            response=schemas.Entry,
            query=(_PATH,),
            errors=(403, 404, 503),
        ),
        Operation(
            "POST",
            f"{base}/mkdir",
            _on(files_of, make_dir, name_prefix),
            "Create a directory",
            body=schemas.MkdirRequest,
            response=schemas.Entry,
            errors=(403, 404, 409, 503),
        ),
        Operation(
            "POST",
            f"{base}/move",
            _on(files_of, move_file, name_prefix),
            "Move or rename",
            body=schemas.MoveRequest,
            response=schemas.Entry,
            errors=(403, 404, 409, 503),
        ),
    )


FILE_OPERATIONS = file_operations("/v1/files", lambda d: d.files)
CELL_FILE_OPERATIONS = file_operations("/cell/files", lambda d: d.cell_files, "cell_")
