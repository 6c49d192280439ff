"""Connect RPC with the JSON codec, the little of it envd needs.

Unary: `POST /<package.Service>/<Method>`, `application/json` both ways, errors as
`{"code", "message"}` with an HTTP status. Server streams: `application/connect+json`,
each message in an envelope of one flag byte and a big-endian u32 length; the last envelope
has flag 0x02 and carries the end of the stream, `{}` or `{"error": {...}}`. A stream's
deadline is the client's `Connect-Timeout-Ms`: when it passes, the stream ends with
`deadline_exceeded`, as connect-go ends envd's. A stream whose sandbox goes mid-way (the
hop to its daemon drops) drops its client's connection too, as E2B's does: the SDKs then
probe the sandbox and report it gone. The drop is a TCP reset: the Python SDK's transport
(pyqwest) takes a reset as the connection lost, but a close before the body's end as the
peer breaking HTTP, and then never probes.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from sandcell.compat.e2b.bodies import json_object
from sandcell.compat.e2b.errors import connect_error
from sandcell.errors import ErrorCode, ServiceError

END_STREAM = 0x02
COMPRESSED = 0x01
HEADER = struct.Struct(">BI")
MAX_MESSAGE = 1_048_576
STREAM_MEDIA = "application/connect+json"
TIMEOUT_HEADER = "connect-timeout-ms"


class StreamRequest(dict[str, Any]):
    """A server stream's request message, and the seconds its client gives the stream
    (None: no deadline)."""

    timeout_s: float | None = None


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(flags, len(data)) + data


def end_stream(error: dict[str, str] | None = None) -> bytes:
    return envelope({"error": error} if error else {}, END_STREAM)


def timeout_s(headers: Mapping[str, str]) -> float | None:
    """`Connect-Timeout-Ms` in seconds (absent or 0: no deadline), or a 400."""
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10:
        raise ServiceError(ErrorCode.BAD_REQUEST, "Connect-Timeout-Ms must be up to 10 digits")
    return int(raw) / 1000 or None


def first_message(body: bytes, timeout: float | None = None) -> StreamRequest:
    """The one request message of a server stream, out of its envelope, with the seconds
    the stream is given."""
    if len(body) < HEADER.size:
        raise ServiceError(ErrorCode.BAD_REQUEST, "a Connect envelope needs 5 bytes")
    flags, length = HEADER.unpack_from(body)
    if flags & COMPRESSED:
        raise ServiceError(ErrorCode.BAD_REQUEST, "compressed envelopes are not supported")
    if length > MAX_MESSAGE or HEADER.size + length > len(body):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the envelope's length is wrong")
    message = StreamRequest(json_object(body[HEADER.size : HEADER.size + length]))
    message.timeout_s = timeout
    return message


async def stream(
    events: AsyncIterator[dict[str, Any]],
    timeout: float | None = None,
    abort: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """Envelopes for `events`, then the end of the stream (with the error that cut it, or
    `deadline_exceeded` once `timeout` seconds have passed). With `abort` (the server's way
    to drop the connection), a sandbox unreachable after the first event drops it instead."""
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    sent = False
    try:
        while True:
            # Only the wait for the next event is bounded: the yield sends, outside it.
            async with asyncio.timeout_at(deadline):
                event = await anext(events, None)
            if event is None:
                break
            yield envelope(event)
            sent = True
    except ServiceError as exc:
        if sent and abort is not None and exc.code is ErrorCode.SANDBOX_UNREACHABLE:
            abort()
            return
        yield end_stream(connect_error(exc))
        return
    except TimeoutError:
        yield end_stream({"code": "deadline_exceeded", "message": "the stream's deadline passed"})
        return
    yield end_stream()


def integer(value: Any, name: str, default: int = 0) -> int:
    """A JSON integer field (proto3 JSON may send 64-bit ones as strings), or a 400."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal() and value.isascii():
        return int(value)
    raise ServiceError(ErrorCode.BAD_REQUEST, f"{name} must be an integer")


def obj(message: dict[str, Any], name: str) -> dict[str, Any]:
    """A nested message field: {} when absent, a 400 when it is not an object."""
    value = message.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceError(ErrorCode.BAD_REQUEST, f"{name} must be an object")
    return value
