"""The node API's HTTP/1.1: one request parsed within bounds, and the answers, in the spec's
error shape for a refusal.

The node API is not an ASGI app: ASGI has no way to hand a connection's raw bytes over after
a `CONNECT`, and the relay is most of what a node serves. Control calls are few and small, so
each is one request on its own connection (`connection: close`), with a `content-length` body
only; the relay is one `CONNECT` per connection, after which the bytes are the cell's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from sandcell.errors import ErrorCode, ServiceError

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 10.0  # a router sends a request at once; a silent client is cut here
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) ([\x21-\x7e]{1,2048}) HTTP/1\.1")
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([\x20-\x7e\t]*?)[ \t]*")


def bad(message: str) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, message)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names; a repeated name is refused
    body: bytes = b""

    def json(self) -> Any:
        if not self.body:
            return {}
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            raise bad("the body is not JSON") from None


def parse(buffer: bytes) -> tuple[Request, int] | None:
    """The request at the start of `buffer` and how many bytes it took, or None while it is
    incomplete. Refuses (a 400 ServiceError, 413 for a large body) what is not a plain
    HTTP/1.1 request."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0 and len(buffer) <= MAX_HEAD_BYTES:
        return None
    if not 0 <= end <= MAX_HEAD_BYTES:
        raise bad("the request head is too large")
    line, *lines = buffer[:end].split(b"\r\n")
    matched = _REQUEST_LINE.fullmatch(line)
    if matched is None:
        raise bad("not an HTTP/1.1 request line")
    headers: dict[str, str] = {}
    for raw in lines:
        field = _HEADER.fullmatch(raw)
        if field is None:
            raise bad("a malformed header")
        name = field[1].decode().lower()
        if name in headers:
            raise bad(f"header {name!r} is repeated")
        headers[name] = field[2].decode()
    start = end + 4
    length = _length(headers)
    if len(buffer) < start + length:
        return None
    body = buffer[start : start + length]
    return Request(matched[1].decode(), matched[2].decode(), headers, body), start + length


def _length(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise bad("a chunked body is not taken here: send content-length")
    length = headers.get("content-length", "0")
    if not length.isascii() or not length.isdigit():
        raise bad("content-length is not a number")
    if int(length) > MAX_BODY_BYTES:
        raise ServiceError(ErrorCode.PAYLOAD_TOO_LARGE, f"a body of at most {MAX_BODY_BYTES} bytes")
    return int(length)


def answer(status: int, payload: Any = None) -> bytes:
    """A whole answer that ends the connection; JSON when there is a payload."""
    reason = HTTPStatus(status).phrase
    body = b"" if payload is None else json.dumps(payload).encode()
    kind = b"content-type: application/json\r\n" if payload is not None else b""
    return (
        b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, reason.encode(), kind, len(body))
    ) + body


def refusal(error: ServiceError) -> bytes:
    return answer(error.status, error.body())


TUNNEL_OPEN = b"HTTP/1.1 200 Connection Established\r\n\r\n"
