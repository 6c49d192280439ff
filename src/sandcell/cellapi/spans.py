"""The cell's spans as the host↔cell contract carries them (SPEC §20), and W3C trace context.

The router names its span of a call in a `traceparent` request header. A daemon that gets a
valid one times its own steps of that call and hands them back in one response header,
`sandcell-spans`, compact JSON, a list of

    {"n": "exec.run", "s": 1764650000123456789, "e": 1764650000125456789, "a": {"exit_code": 0}}

(`n` a name of `CELL_SPANS`, `s` and `e` start and end in Unix nanoseconds on the cell's
clock, `a` attributes of that name's keys only, each an integer or a boolean). Only the steps
finished when the answer's head leaves travel: a unary answer carries all of them (an exec's
spawn and run, a file read or write), a streamed one those done before its head (a followed
process's spawn); the rest of a stream is the router's to time. Nothing inside the cell
exports anything.

The daemon is not trusted (code in the cell may control it), so `decode` takes nothing on
faith: past `MAX_HEADER_BYTES` the header is ignored, at most `MAX_SPANS` spans are read, an
unknown name, key or type drops that span, times are clamped inside the router's own span,
and no value, however malformed, raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
SPANS_HEADER = b"sandcell-spans"
MAX_HEADER_BYTES = 2048
MAX_SPANS = 8
# Each name the cell may report, and the attribute keys it may carry: numbers and flags
# only, so no text of the cell's (a command, a path, its output) can ride along.
CELL_SPANS: dict[str, frozenset[str]] = {
    "exec.spawn": frozenset(),
    "exec.run": frozenset({"exit_code", "timed_out"}),
    "process.spawn": frozenset({"pid"}),
    "file.read": frozenset({"bytes"}),
    "file.write": frozenset({"bytes"}),
}
_MAX_INT = 1 << 53  # attributes: what a JSON number holds exactly
_MAX_TIME = 1 << 63  # Unix nanoseconds, as OTLP's fixed64 holds them
_TRACEPARENT_RE = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


def parse_traceparent(value: bytes) -> TraceParent | None:
    """A W3C traceparent (Trace Context level 1, §3.2), strictly: lower-case hex, version ff
    and all-zero ids refused, version 00 exactly 55 characters, a later version's extra
    fields kept apart by a dash. Anything else is None: a bad one is ignored, never an error."""
    value = value.strip(b" \t")
    match = _TRACEPARENT_RE.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> bytes:
    return b"00-%032x-%016x-%s" % (trace_id, span_id, b"01" if sampled else b"00")


def traced(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request carries one valid, sampled traceparent (two are as bad as a
    malformed one; an unsampled trace records nothing, so the daemon times nothing)."""
    found = None
    for name, value in headers:  # every daemon request passes here: no list built
        if name == TRACEPARENT:
            if found is not None:
                return False
            found = value
    parsed = parse_traceparent(found) if found is not None else None
    return parsed is not None and parsed.sampled


@dataclass(frozen=True, slots=True)
class CellSpan:
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, int | bool]


def encode(spans: list[CellSpan]) -> bytes:
    """The daemon's side: at most MAX_SPANS, the header's bound kept (later spans dropped)."""
    items: list[dict[str, Any]] = []
    for span in spans[:MAX_SPANS]:
        item: dict[str, Any] = {"n": span.name, "s": span.start_ns, "e": span.end_ns}
        if span.attributes:
            item["a"] = span.attributes
        items.append(item)
    while items:
        data = json.dumps(items, separators=(",", ":")).encode()
        if len(data) <= MAX_HEADER_BYTES:
            return data
        items.pop()
    return b"[]"


def decode(value: bytes, floor_ns: int, ceiling_ns: int) -> list[CellSpan]:
    """The host's side: the well-formed spans of a daemon's header, each clamped inside
    [floor_ns, ceiling_ns] (the router's span of the call); anything else dropped."""
    if len(value) > MAX_HEADER_BYTES:
        return []
    try:
        items = json.loads(value)
    except (ValueError, RecursionError):
        return []
    if not isinstance(items, list):
        return []
    spans = []
    for item in items[:MAX_SPANS]:
        span = _span(item, floor_ns, ceiling_ns)
        if span is not None:
            spans.append(span)
    return spans


def _span(item: Any, floor_ns: int, ceiling_ns: int) -> CellSpan | None:
    if not isinstance(item, dict) or not set(item) <= {"n", "s", "e", "a"}:
        return None
    name, start, end, attributes = item.get("n"), item.get("s"), item.get("e"), item.get("a", {})
    if not isinstance(name, str) or name not in CELL_SPANS:
        return None
    if not (_is_time(start) and _is_time(end)) or not isinstance(attributes, dict):
        return None
    allowed = CELL_SPANS[name]
    if not set(attributes) <= allowed:
        return None
    if not all(isinstance(v, bool) or _is_int(v) for v in attributes.values()):
        return None
    start = min(max(start, floor_ns), ceiling_ns)
    end = min(max(end, start), ceiling_ns)
    return CellSpan(name, start, end, dict(attributes))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and -_MAX_INT < value < _MAX_INT


def _is_time(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_TIME
