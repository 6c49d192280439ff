"""envd's REST `/files`: downloads and uploads (raw octet-stream or multipart form).

Every upload streams on to the daemon as it arrives, bounded there by the template's disk
quota: a raw body as it is, a gzip body inflated piece by piece, a form read part by part
(`sandcell.http.multipart`), each file part sent as its own upload while the rest of the
form is still on its way. Nothing holds a whole body, and no parse holds the event loop.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.compat.e2b import cellfiles
from sandcell.compat.e2b.envd import watch
from sandcell.compat.e2b.envd.filesystem import METADATA_PREFIX, e2b_metadata
from sandcell.compat.e2b.gateway import Gateway
from sandcell.compat.e2b.paths import to_cell, to_e2b
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import declared_length, stream_body, too_large
from sandcell.http.multipart import FormLimits, FormReader, drain
from sandcell.store import SandboxRecord

METADATA_HEADER = "x-metadata-"
# A gzip body inflates to at most this much (a small bomb cannot grow past it on its way).
MAX_UPLOAD = 32 * 1_048_576
INFLATE_STEP = 65_536  # bytes inflated at a time
# Files in one form: the e2b SDK sends one part per file of a `write_files` call (envd
# reads only the parts named "file"; the others are skipped, and count too).
FORM = FormLimits(max_parts=1_000)


async def download(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    path = to_cell(request.query_params.get("path"))
    response = await cellfiles.send(gateway, record, "GET", query={"path": path})
    return StreamingResponse(response.chunks(), media_type="application/octet-stream")


async def _inflated(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The upload as written: `gzip=True` uploads arrive gzip-encoded. Inflated as the
    body comes, a step at a time, and refused (413) once past `limit`."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    size = 0
    async for chunk in chunks:
        data = chunk
        while data and not inflater.eof:
            try:
                out = inflater.decompress(data, INFLATE_STEP)
            except zlib.error as exc:
                raise ServiceError(ErrorCode.BAD_REQUEST, "the gzip body cannot be read") from exc
            data = inflater.unconsumed_tail
            size += len(out)
            if size > limit:
                raise too_large(limit)
            if out:
                yield out
    if not inflater.eof:
        raise ServiceError(ErrorCode.BAD_REQUEST, "the gzip body is cut short")


async def _put(
    gateway: Gateway,
    record: SandboxRecord,
    path: str | None,
    chunks: AsyncIterator[bytes],
    length: int | None = None,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One file written from `chunks` as they come (chunked to the daemon unless `length`
    is known), at the workspace or the cell's /tmp (cellfiles)."""
    if not path:
        raise ServiceError(ErrorCode.BAD_REQUEST, "each uploaded file needs a path")
    query = {"path": to_cell(path)}
    if metadata:
        query["metadata"] = json.dumps({METADATA_PREFIX + k: v for k, v in metadata.items()})
    watched = bool(watch.watching(record.id, query["path"]))
    created = watched and not await _exists(gateway, record, query["path"])
    answer = await cellfiles.send(gateway, record, "PUT", query=query, stream=chunks, length=length)
    entry = await answer.json()
    if watched:
        watch.wrote(record.id, entry, created)
    written: dict[str, Any] = {"name": entry["name"], "type": "file", "path": to_e2b(entry["path"])}
    kept = e2b_metadata(entry)
    if kept:
        written["metadata"] = kept
    return written


async def _exists(gateway: Gateway, record: SandboxRecord, path: str) -> bool:
    try:
        await cellfiles.send(gateway, record, "GET", "stat", query={"path": path})
    except ServiceError as exc:
        if exc.code is not ErrorCode.FILE_NOT_FOUND:
            raise
        return False
    return True


def _metadata(request: Request) -> dict[str, str]:
    """E2B's user metadata for an upload: its `X-Metadata-<key>` headers, keys lower-cased
    (as envd keeps them)."""
    return {
        name[len(METADATA_HEADER) :].lower(): value
        for name, value in request.headers.items()
        if name.lower().startswith(METADATA_HEADER) and len(name) > len(METADATA_HEADER)
    }


async def _form(
    gateway: Gateway,
    record: SandboxRecord,
    content_type: str,
    body: AsyncIterator[bytes],
    query_path: str | None,
    metadata: dict[str, str],
) -> list[dict[str, Any]]:
    """Each part named "file" written as it arrives, at the query's path or its filename."""
    written = []
    async for part in FormReader(content_type, body, FORM).parts():
        if part.name == "file":
            name = query_path or part.filename
            written.append(await _put(gateway, record, name, part.chunks(), None, metadata))
    return written


async def upload(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    content_type = request.headers.get("content-type", "application/octet-stream")
    encoding = request.headers.get("content-encoding", "").strip().lower()
    query_path = request.query_params.get("path")
    metadata = _metadata(request)
    if encoding not in ("", "identity", "gzip"):
        raise ServiceError(ErrorCode.BAD_REQUEST, f"unsupported Content-Encoding {encoding!r}")
    body = stream_body(request)
    length = declared_length(request)
    if encoding == "gzip":
        body, length = _inflated(body, MAX_UPLOAD), None
    try:
        if content_type.startswith("multipart/"):
            written = await _form(gateway, record, content_type, body, query_path, metadata)
        else:
            written = [await _put(gateway, record, query_path, body, length, metadata)]
    except ServiceError:
        await drain(request)
        raise
    return JSONResponse(written)
