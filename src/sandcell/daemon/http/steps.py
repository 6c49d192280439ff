"""The daemon's own steps of a traced call, handed back with its answer (SPEC §20).

The daemon exports nothing: a request that carries a valid W3C `traceparent` (the router's
span of the call) gets a `Steps` recorder for its duration, the handlers' `step(...)` blocks
time themselves into it, and the answer's head carries what finished by then in the
`sandcell-spans` header (format, names and bounds: `cellapi.spans`). A request without one
costs a look at its headers and a context variable left unset; `step` then hands back one
shared no-op block.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.cellapi.spans import CELL_SPANS, MAX_SPANS, SPANS_HEADER, CellSpan, encode, traced

_STEPS: contextvars.ContextVar[Steps | None] = contextvars.ContextVar("steps", default=None)


class Steps:
    """The finished steps of one call, at most MAX_SPANS."""

    def __init__(self) -> None:
        self.spans: list[CellSpan] = []

    @contextlib.contextmanager
    def step(self, name: str, attributes: dict[str, int | bool]) -> Iterator[dict[str, int | bool]]:
        assert name in CELL_SPANS, name
        start = time.time_ns()
        try:
            yield attributes  # the block may add attributes of its outcome
        finally:
            if len(self.spans) < MAX_SPANS:
                self.spans.append(CellSpan(name, start, time.time_ns(), attributes))


_UNTRACED: contextlib.nullcontext[dict[str, int | bool]] = contextlib.nullcontext({})


def step(name: str, **attributes: int | bool) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """`with step("exec.run") as outcome: ...; outcome["exit_code"] = code`: timed into the
    call's steps when it is traced; a shared no-op otherwise (what it is handed is dropped)."""
    steps = _STEPS.get()
    if steps is None:
        return _UNTRACED
    return steps.step(name, attributes)


class TracedSteps:
    """ASGI middleware: a Steps recorder for each traced HTTP request, its spans put in the
    answer's head."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not traced(scope["headers"]):
            await self.app(scope, receive, send)
            return
        steps = Steps()
        token = _STEPS.set(steps)

        async def send_with_spans(message: Message) -> None:
            if message["type"] == "http.response.start" and steps.spans:
                headers = [*message.get("headers", []), (SPANS_HEADER, encode(steps.spans))]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_spans)
        finally:
            _STEPS.reset(token)
