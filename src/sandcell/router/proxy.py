"""The core's HTTP adapter: a Starlette request as a `Call` to a daemon, and the daemon's
`Answer` back as a response (SPEC §5's `ANY /v1/sandboxes/{id}/<rest>`, preview URLs and
port relays all end here).

Small bodies are buffered and bound to the token (`bsh`); file uploads stream through
untouched in both directions, so a large file is never held whole in memory. A daemon's
answer that has arrived whole by the time its head is read (most are) goes back as one
buffered response; others are relayed as they come.
"""

from __future__ import annotations

import asyncio

from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sandcell.cellapi.limits import MAX_JSON_BODY
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http import hop
from sandcell.http.bodies import declared_length, read_body
from sandcell.http.streamed import on_disconnect
from sandcell.router.core import Answer, Call, Router
from sandcell.store import SandboxRecord

STREAM_UPLOADS_FROM = 1_048_576


def sandbox_target(request: HTTPConnection, prefix: str, daemon_prefix: str = "/v1/") -> str:
    """The daemon's path for the part of the request's path after `prefix`, kept byte for
    byte as the client encoded it, with its query."""
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    if not raw.startswith(prefix.encode()):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the path is not a plain sandbox path")
    query = request.scope.get("query_string", b"")
    tail = raw[len(prefix) :] + (b"?" + query if query else b"")
    return daemon_prefix + tail.decode("latin-1")


async def call_of(request: Request, target: str) -> Call:
    """The request as a call to `target`: its end-to-end headers, and its body whole (to
    bind in the token) or, for a large or unsized upload, streamed as it comes."""
    headers = hop.forwarded(request.scope["headers"])
    length = declared_length(request)
    upload = request.method == "PUT" and target.partition("?")[0] == "/v1/files"
    if upload and (length is None or length > STREAM_UPLOADS_FROM):
        return Call(request.method, target, headers, None, request.stream(), length)
    return Call(request.method, target, headers, await read_body(request, MAX_JSON_BODY))


async def forward(router: Router, request: Request, record: SandboxRecord, target: str) -> Response:
    """The request on the sandbox's daemon at `target`, the answer relayed back."""
    return respond(await router.send(record, await call_of(request, target)))


def respond(answer: Answer) -> Response:
    """The daemon's answer to the user: buffered when it is already whole, else relayed."""
    if answer.complete:
        response = Response(answer.body(), status_code=answer.status)
        kept = [(n, v) for n, v in hop.relayed(answer.headers) if n != b"content-length"]
        response.raw_headers[:0] = kept  # before the length Starlette computed
        return response
    return Relayed(answer)


class Relayed(StreamingResponse):
    """The daemon's answer as it comes. A client that goes away closes the connection to the
    daemon, which ends the relay: one watcher task, where Starlette's streaming response
    runs a task group with a cancel scope per response."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.chunks(), answer.status, background=BackgroundTask(_settle, answer))
        self.raw_headers = hop.relayed(answer.headers)
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(on_disconnect(receive, self.answer.close))
        try:
            await self.stream_response(send)
        finally:
            watcher.cancel()
            await self.background()  # type: ignore[misc]


async def _settle(answer: Answer) -> None:
    """After a relayed answer: its connection back to the pool, or closed if cut short."""
    answer.release()
