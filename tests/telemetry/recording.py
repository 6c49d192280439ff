"""Helpers shared by the trace tests: tracing on in this process with an in-memory exporter,
and lookups over finished spans."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandcell import telemetry
from sandcell.telemetry.otel import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Recorded:
    """Tracing on in this process; `spans()` flushes and returns what finished."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracing = Tracing(self.exporter)

    def spans(self) -> Sequence[ReadableSpan]:
        self.tracing.provider.force_flush()
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]


@contextlib.contextmanager
def recorded() -> Iterator[Recorded]:
    recording = Recorded()
    telemetry.active = recording.tracing
    try:
        yield recording
    finally:
        telemetry.disable()
