"""Tracing with the OpenTelemetry SDK: imported only when `[telemetry] otlp_endpoint` is set.

One `TracerProvider` of sandcell's own (service.name "sandcell"; the process-wide provider is
left alone), a `BatchSpanProcessor` exporting OTLP/HTTP protobuf. What spans carry is chosen
here, in one place: routes (with ids templated), methods, statuses, sandbox ids, principals,
numbers of the cell's steps; never a command, a body, a query string, a header's value or a
secret.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
)
from starlette.types import Scope

from sandcell import __version__
from sandcell.cellapi import spans as wire

if TYPE_CHECKING:
    from sandcell.router.core import Answer, Call
    from sandcell.store import SandboxRecord

Exchange = Callable[["SandboxRecord", "Call"], Awaitable["Answer"]]
_PATH_PARAM = re.compile(r"\{(\w+):path\}")
_WORD = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
MAX_TRACESTATE_BYTES = 512  # W3C: a vendor may drop a longer one
MAX_TRACESTATE_MEMBERS = 32
MAX_ID = 64  # a sandbox id from a request's path is kept up to this length
_KEY = rb"[a-z0-9][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_MEMBER = re.compile(
    rb"(" + _KEY + rb")=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)


def otlp_exporter(url: str) -> SpanExporter:
    return OTLPSpanExporter(endpoint=url, timeout=10)


class Tracing:
    def __init__(self, exporter: SpanExporter) -> None:
        resource = Resource.create({"service.name": "sandcell", "service.version": __version__})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("sandcell", __version__)

    def shutdown(self) -> None:
        self.provider.shutdown()

    # -- API calls ------------------------------------------------------------------------

    def request(self, scope: Scope) -> ServerSpan:
        """The server span of one API call, current from now until `finish`."""
        method = scope["method"]
        span = self.tracer.start_span(
            method,
            context=remote_parent(scope["headers"]),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method},
        )
        return ServerSpan(span, method, context.attach(trace.set_span_in_context(span)))

    async def hop(self, exchange: Exchange, record: SandboxRecord, call: Call) -> Answer:
        """`exchange(record, call)` as a client span, named to the daemon in `traceparent`;
        the daemon's steps in its answer become this span's children."""
        current = trace.get_current_span()
        if current.is_recording():
            current.set_attribute("sandcell.sandbox_id", record.id)
        path = _templated(call.target.partition("?")[0])
        started = time.time_ns()
        with self.tracer.start_as_current_span(
            f"daemon {call.method} {path}",
            kind=SpanKind.CLIENT,
            attributes={"sandcell.sandbox_id": record.id, "http.request.method": call.method},
            start_time=started,
        ) as span:
            answer = await exchange(record, dataclasses.replace(call, headers=_carried(call, span)))
            span.set_attribute("http.response.status_code", answer.status)
            self._cell_spans(span, answer, started, time.time_ns())
        return answer

    def _cell_spans(self, hop: Span, answer: Answer, floor: int, ceiling: int) -> None:
        """The daemon's `sandcell-spans` header, taken out of the answer (it is the router's,
        not the caller's), as children of the hop."""
        headers = answer.headers
        found = [v for n, v in headers if n.lower() == wire.SPANS_HEADER]
        if not found:
            return
        headers[:] = [(n, v) for n, v in headers if n.lower() != wire.SPANS_HEADER]
        if len(found) != 1 or not hop.is_recording():
            return
        parent = trace.set_span_in_context(hop)
        for cell in wire.decode(found[0], floor, ceiling):
            attributes: dict[str, str | int | bool] = {
                f"sandcell.{k}": v for k, v in cell.attributes.items()
            }
            attributes["sandcell.origin"] = "cell"
            child = self.tracer.start_span(
                cell.name, context=parent, attributes=attributes, start_time=cell.start_ns
            )
            child.end(end_time=cell.end_ns)

    # -- blocks of the manager, proxies and builder ---------------------------------------

    def span(self, name: str, attributes: Mapping[str, str | int | bool]) -> Any:
        return self.tracer.start_as_current_span(name, attributes=dict(attributes))

    def annotate(self, attributes: Mapping[str, str | int | bool]) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(dict(attributes))


class ServerSpan:
    """An API call's span, ended by the middleware once the call is answered."""

    def __init__(self, span: Span, method: str, token: object) -> None:
        self.span = span
        self.method = method
        self._token = token

    def finish(self, scope: Scope, route: str, status: int, principal: str | None) -> None:
        span = self.span
        params = scope.get("path_params", {})
        if route != "unmatched":
            span.update_name(f"{self.method} {_route(route, params)}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(StatusCode.ERROR)
        sandbox_id = params.get("sandbox_id")
        if isinstance(sandbox_id, str) and len(sandbox_id) <= MAX_ID:  # a caller's, unchecked
            span.set_attribute("sandcell.sandbox_id", sandbox_id)
        if principal is not None:
            span.set_attribute("sandcell.principal", principal)
        span.end()
        context.detach(self._token)  # type: ignore[arg-type]


def remote_parent(headers: list[tuple[bytes, bytes]]) -> Context | None:
    """The caller's span as the parent, when it sent exactly one valid traceparent (and its
    tracestate, bounded); None otherwise: the call starts a trace of its own."""
    parents = [v for n, v in headers if n == wire.TRACEPARENT]
    if len(parents) != 1 or (parsed := wire.parse_traceparent(parents[0])) is None:
        return None
    caller = SpanContext(
        parsed.trace_id,
        parsed.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parsed.flags & TraceFlags.SAMPLED),
        trace_state=trace_state([v for n, v in headers if n == wire.TRACESTATE]),
    )
    return trace.set_span_in_context(NonRecordingSpan(caller))


def trace_state(values: list[bytes]) -> TraceState:
    """The caller's tracestate (W3C Trace Context §3.3), checked here so that a malformed one
    is dropped whole and quietly (the SDK's own parser logs the caller's text)."""
    pairs: dict[str, str] = {}
    if sum(map(len, values)) > MAX_TRACESTATE_BYTES:
        return TraceState()
    for value in values:
        for member in value.split(b","):
            member = member.strip(b" \t")
            if not member:
                continue
            match = _MEMBER.fullmatch(member)
            if match is None or len(pairs) == MAX_TRACESTATE_MEMBERS:
                return TraceState()
            key, item = match.group(1).decode(), match.group(2).decode()
            if key in pairs:
                return TraceState()
            pairs[key] = item
    return TraceState(list(pairs.items()))


def _carried(call: Call, span: Span) -> list[tuple[bytes, bytes]]:
    """The call's headers, the caller's own trace context replaced by the hop span's."""
    headers = [(n, v) for n, v in call.headers if n not in (wire.TRACEPARENT, wire.TRACESTATE)]
    own = span.get_span_context()
    sampled = bool(own.trace_flags & TraceFlags.SAMPLED)
    headers.append((wire.TRACEPARENT, wire.format_traceparent(own.trace_id, own.span_id, sampled)))
    if state := own.trace_state.to_header():
        headers.append((wire.TRACESTATE, state.encode("latin-1")))
    return headers


def _route(route: str, params: Mapping[str, Any]) -> str:
    """A route's template with its catch-all filled in (the proxied `{rest:path}` becomes
    `exec`, `files`, ...), numbers in it templated, so names stay few."""

    def filled(match: re.Match[str]) -> str:
        value = params.get(match.group(1))
        return _templated(value) if isinstance(value, str) else match.group(0)

    return _PATH_PARAM.sub(filled, route)


def _templated(path: str) -> str:
    """`path` with few distinct values: numbers as `{n}`; past a relayed port, a segment that
    is not a short lower-case word, or eight segments, the rest as `{path}` (a caller's own
    paths, and ids, never name a span)."""
    kept: list[str] = []
    for segment in path.split("/"):
        number = segment.isascii() and segment.isdigit()
        if kept[-2:] == ["ports", "{n}"] or len(kept) == 8:
            kept.append("{path}")
            break
        if not (number or not segment or _WORD.fullmatch(segment)):
            kept.append("{path}")
            break
        kept.append("{n}" if number else segment)
    return "/".join(kept)
