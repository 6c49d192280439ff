"""Multipart form bodies read as they arrive, part by part, never whole.

A façade's upload form can be as large as its files, and a hostile one can be two megabytes
of tiny parts or a part nested a few thousand forms deep. The stdlib's MIME parser, run on
the whole body, held the event loop for seconds on the first and recursed into a 500 on the
second. Here python-multipart's streaming parser (the one Starlette uses) is fed the body
in slices as it comes, the loop gets a turn between slices, and what a form may hold is
bounded: the number of parts, each part's headers (the parser's own bounds), the fields
read into memory. A part's content is bytes whatever its type: a nested form is not
followed, so nesting costs nothing.

`FormReader.parts()` yields each `Part` once its headers are read; its content is read on
with `Part.chunks()` (the reader moves on past whatever a consumer leaves unread). One
part at a time, pulled by the consumer: a file part can stream on to a daemon while the
rest of the form has not arrived yet.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from sandcell.errors import ErrorCode, ServiceError

# Bytes handed to the parser between two turns of the event loop: its byte-by-byte states
# (a part's headers) cost it ~3 µs a byte at worst, so a slice holds the loop ~10 ms at most.
SLICE = 4096
MAX_BOUNDARY = 70  # RFC 2046 §5.1.1
# What a client may still send after a refused form, read and dropped so that it reads
# the answer instead of a connection reset (beyond this, the connection is just closed).
DRAIN_UP_TO = 4 * 1_048_576


def bad_form(message: str, **details: object) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, message, details or None)


@dataclass(frozen=True)
class FormLimits:
    max_parts: int  # parts in one form, fields and files alike
    max_field_bytes: int = 65_536  # a field read into memory (`Part.read`)


class Part:
    """One part of a form: its headers (names lower-case) and, read on, its content."""

    def __init__(self, reader: FormReader, headers: dict[str, str]) -> None:
        self._reader = reader
        self.headers = headers
        self.done = False
        _, params = parse_options_header(headers.get("content-disposition", ""))
        self.name = _text(params.get(b"name"))
        self.filename = _text(params.get(b"filename"))

    async def chunks(self) -> AsyncIterator[bytes]:
        """The part's content as it arrives, in pieces of at most a slice."""
        while not self.done:
            chunk = await self._reader.content(self)
            if chunk:
                yield chunk

    async def read(self, limit: int | None = None) -> bytes:
        """The whole content of a field, refused (400) past `limit` bytes (by default the
        form's `max_field_bytes`)."""
        limit = self._reader.limits.max_field_bytes if limit is None else limit
        data = bytearray()
        async for chunk in self.chunks():
            data += chunk
            if len(data) > limit:
                raise bad_form(
                    f"the form field {self.name!r} exceeds {limit} bytes", limit_bytes=limit
                )
        return bytes(data)

    async def text(self) -> str:
        try:
            return (await self.read()).decode()
        except UnicodeDecodeError:
            raise bad_form(f"the form field {self.name!r} is not UTF-8") from None


def _text(value: bytes | None) -> str | None:
    # parse_options_header decodes the header as latin-1 and re-encodes it; names sent as
    # UTF-8 (as httpx and requests send them) come back as they were.
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.decode("latin-1")


def _plain(headers: dict[str, str]) -> dict[str, str]:
    """A part's headers, if its content is plain bytes: a form in a form (the 3,000-deep
    attack) or a transfer encoding (RFC 7578 §4.7: not to be sent) is a 400, not read."""
    if headers.get("content-type", "").lower().startswith("multipart/"):
        raise bad_form("a part of a form may not be a form itself")
    encoding = headers.get("content-transfer-encoding", "binary").lower()
    if encoding not in ("7bit", "8bit", "binary"):
        raise bad_form(f"unsupported Content-Transfer-Encoding {encoding!r} in a form")
    return headers


class FormReader:
    """The parts of a `multipart/*` body read from `body` (its chunks as they arrive)."""

    def __init__(self, content_type: str, body: AsyncIterator[bytes], limits: FormLimits):
        media, params = parse_options_header(content_type)
        boundary = params.get(b"boundary", b"")
        if not media.startswith(b"multipart/") or not boundary:
            raise bad_form("a multipart form needs a boundary in its Content-Type")
        if len(boundary) > MAX_BOUNDARY:
            raise bad_form(f"the form's boundary is longer than {MAX_BOUNDARY} bytes")
        self.limits = limits
        self._body = body
        self._events: deque[tuple[str, bytes | dict[str, str] | None]] = deque()
        self._part: Part | None = None
        self._count = 0
        self._ended = False  # the closing boundary was seen
        self._headers: dict[str, str] = {}
        self._field = bytearray()
        self._value = bytearray()
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._on_part_begin,
                "on_header_field": lambda data, start, end: self._field.extend(data[start:end]),
                "on_header_value": lambda data, start, end: self._value.extend(data[start:end]),
                "on_header_end": self._on_header_end,
                "on_headers_finished": lambda: self._events.append(("part", self._headers)),
                "on_part_data": lambda data, start, end: self._events.append(
                    ("data", data[start:end])
                ),
                "on_part_end": lambda: self._events.append(("end", None)),
                "on_end": self._on_end,
            },
        )

    def _on_part_begin(self) -> None:
        self._count += 1
        if self._count > self.limits.max_parts:
            raise bad_form(
                f"the form has more than {self.limits.max_parts} parts",
                limit_parts=self.limits.max_parts,
            )
        self._headers = {}

    def _on_header_end(self) -> None:
        name = self._field.decode("latin-1").strip().lower()
        self._headers.setdefault(name, self._value.decode("latin-1").strip())
        self._field.clear()
        self._value.clear()

    def _on_end(self) -> None:
        self._ended = True

    async def parts(self) -> AsyncIterator[Part]:
        """Each part once its headers are read; the content a consumer leaves is skipped."""
        while True:
            if self._part is not None:
                while not self._part.done:
                    await self.content(self._part)  # the rest of it, dropped
                self._part = None
            event = await self._next()
            if event is None:
                return
            kind, value = event
            if kind == "part" and isinstance(value, dict):
                self._part = Part(self, _plain(value))
                yield self._part

    async def content(self, part: Part) -> bytes:
        """The next piece of `part`'s content, b"" once it is done (then `part.done`)."""
        if part.done:
            return b""
        event = await self._next()
        if event is None or event[0] == "part":
            raise bad_form("the form's parts are not well formed")  # the parser sees to it
        kind, value = event
        if kind == "end":
            part.done = True
            return b""
        return value if isinstance(value, bytes) else b""

    async def _next(self) -> tuple[str, bytes | dict[str, str] | None] | None:
        """The parser's next event, fed more of the body as needed; None after the end."""
        while not self._events:
            if self._ended:
                return None
            chunk = await anext(self._body, None)
            if chunk is None:
                raise bad_form("the form ends before its closing boundary")
            for start in range(0, len(chunk), SLICE):
                try:
                    self._parser.write(chunk[start : start + SLICE])
                except MultipartParseError as exc:
                    raise bad_form(f"the multipart form cannot be read: {exc}") from None
                if self._ended:
                    break  # the epilogue, if any, is not the form's
                await asyncio.sleep(0)  # a turn for everyone else between slices
        return self._events.popleft()


async def drain(request: Request, limit: int = DRAIN_UP_TO) -> None:
    """Reads and drops what is left of the request's body, up to `limit` bytes: a client
    still sending a refused form then reads the answer, where closing the connection under
    its unread bytes would reset it first."""
    seen = 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                return
    except (ClientDisconnect, RuntimeError):  # gone, or the body was read to its end
        return
