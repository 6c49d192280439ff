"""envd's REST `/files`: downloads and uploads (raw octet-stream or multipart form)."""

from __future__ import annotations

from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.compat.e2b.gateway import Gateway, body_chunks, read_json
from sandcell.compat.e2b.paths import to_e2b, to_workspace
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import read_body
from sandcell.store import SandboxRecord

MAX_UPLOAD = 512 * 1_048_576  # the template's disk quota is the real bound, in the daemon


async def download(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    path = to_workspace(request.query_params.get("path"))
    response = await gateway.daemon(record, "GET", "files", query={"path": path})
    return StreamingResponse(body_chunks(response), media_type="application/octet-stream")


def _parts(content_type: str, body: bytes) -> list[tuple[str | None, bytes]]:
    """(filename, bytes) of each part of a multipart form, by the stdlib's MIME parser."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise SandcellError(ErrorCode.BAD_REQUEST, "the multipart form cannot be read")
    parts: list[Message] = list(message.iter_parts())  # type: ignore[attr-defined]
    return [(p.get_filename(), p.get_payload(decode=True) or b"") for p in parts]


async def upload(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    body = await read_body(request, MAX_UPLOAD)
    content_type = request.headers.get("content-type", "application/octet-stream")
    query_path = request.query_params.get("path")
    if content_type.startswith("multipart/"):
        files = [(query_path or name, data) for name, data in _parts(content_type, body)]
    else:
        files = [(query_path, body)]
    written = []
    for path, data in files:
        if not path:
            raise SandcellError(ErrorCode.BAD_REQUEST, "each uploaded file needs a path")
        relative = to_workspace(path)
        response = await gateway.daemon(record, "PUT", "files", body=data, query={"path": relative})
        entry = await read_json(response)
        written.append({"name": entry["name"], "type": "file", "path": to_e2b(entry["path"])})
    return JSONResponse(written)
