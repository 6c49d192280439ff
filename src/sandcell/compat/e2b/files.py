"""envd's REST `/files`: downloads and uploads (raw octet-stream or multipart form)."""

from __future__ import annotations

import zlib
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.compat.e2b.gateway import Gateway
from sandcell.compat.e2b.paths import to_e2b, to_workspace
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import read_body, too_large
from sandcell.store import SandboxRecord

# Raw uploads stream through to the daemon, bounded by the template's disk quota there. Forms
# and gzip bodies are read (and inflated) here first, so they have a bound of their own.
MAX_UPLOAD = 32 * 1_048_576


async def download(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    path = to_workspace(request.query_params.get("path"))
    response = await gateway.daemon(record, "GET", "files", query={"path": path})
    return StreamingResponse(response.chunks(), media_type="application/octet-stream")


def _parts(content_type: str, body: bytes) -> list[tuple[str | None, bytes]]:
    """(filename, bytes) of each part of a multipart form, by the stdlib's MIME parser."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise SandcellError(ErrorCode.BAD_REQUEST, "the multipart form cannot be read")
    parts: list[Message] = list(message.iter_parts())  # type: ignore[attr-defined]
    return [(p.get_filename(), p.get_payload(decode=True) or b"") for p in parts]


def _decoded(body: bytes, encoding: str) -> bytes:
    """The upload as written: `gzip=True` uploads arrive gzip-encoded. Inflated with a bound,
    so a small bomb cannot grow past the upload limit in memory."""
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise SandcellError(ErrorCode.BAD_REQUEST, f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, MAX_UPLOAD + 1)
    except zlib.error as exc:
        raise SandcellError(ErrorCode.BAD_REQUEST, "the gzip body cannot be read") from exc
    if len(data) > MAX_UPLOAD or inflater.unconsumed_tail:
        raise too_large(MAX_UPLOAD)
    return data


async def _put(
    gateway: Gateway, record: SandboxRecord, path: str | None, data: bytes | Request
) -> dict[str, str]:
    if not path:
        raise SandcellError(ErrorCode.BAD_REQUEST, "each uploaded file needs a path")
    query = {"path": to_workspace(path)}
    entry = await gateway.json(record, "PUT", "files", body=data, query=query)
    return {"name": entry["name"], "type": "file", "path": to_e2b(entry["path"])}


async def upload(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    content_type = request.headers.get("content-type", "application/octet-stream")
    encoding = request.headers.get("content-encoding", "").strip().lower()
    query_path = request.query_params.get("path")
    if not content_type.startswith("multipart/") and encoding in ("", "identity"):
        return JSONResponse([await _put(gateway, record, query_path, request)])
    body = _decoded(await read_body(request, MAX_UPLOAD), encoding)
    if content_type.startswith("multipart/"):
        files = [(query_path or name, data) for name, data in _parts(content_type, body)]
    else:
        files = [(query_path, body)]
    return JSONResponse([await _put(gateway, record, path, data) for path, data in files])
