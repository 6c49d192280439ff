"""The daemon's route table: a secured operation's token is checked here, once, for all.

A check called from each handler is one a new handler can forget. Here the table says what
an operation is (`secured`, and what of its body the token binds), and `routes` wraps every
secured endpoint, HTTP and WebSocket alike, so a handler only ever runs for a request whose
token verified: it finds what was verified with `call_of` (or `json_of`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from sandcell.cellapi import schemas
from sandcell.cellapi.limits import MAX_JSON_BODY
from sandcell.errors import ServiceError
from sandcell.http.bodies import path_with_query, read_body
from sandcell.http.errors import error_response
from sandcell.http.openapi import Endpoint, Operation

if TYPE_CHECKING:
    from sandcell.tokens import VerifiedToken

_CALL = "sandcell.call"  # scope key of the verified call


@dataclass(frozen=True)
class Body:
    """What the guard reads of a request before it checks the token (SPEC §2.1)."""

    limit: int  # bytes read whole first (413 past them); 0: not read here
    bound: bool  # the token must bind the body's hash (`bsh`)


NO_BODY = Body(0, False)  # GET, DELETE; streamed uploads check `bsh` as they stream
JSON_BODY = Body(MAX_JSON_BODY, True)


@dataclass(frozen=True)
class DaemonOperation(Operation):
    """An operation of the daemon. `reads` None: a JSON body when `body` is a shape (a
    class), else nothing."""

    reads: Body | None = None


@dataclass(frozen=True)
class WebSocketOperation:
    """A WebSocket endpoint; its upgrade is a GET signed like any other (SPEC §9, §11)."""

    path: str
    endpoint: Callable[[WebSocket], Awaitable[None]]
    bound: bool = False  # the token must bind the (empty) body's hash


@dataclass(frozen=True)
class Call:
    """What the guard verified of a request, handed to its handler."""

    token: VerifiedToken
    body: bytes | None  # the body, when the operation reads it before the check


def reads(op: Operation) -> Body:
    if isinstance(op, DaemonOperation) and op.reads is not None:
        return op.reads
    return JSON_BODY if isinstance(op.body, type) else NO_BODY


def call_of(connection: HTTPConnection) -> Call:
    call: Call = connection.scope[_CALL]  # a KeyError here: the route is not secured
    return call


def json_of(request: Request, shape: type[schemas.ShapeT]) -> schemas.ShapeT:
    """The verified JSON body as `shape` (a 400 when it is not one)."""
    body = call_of(request).body
    assert body is not None, "the operation reads no body"
    return schemas.parse(shape, body)


def _verify(connection: HTTPConnection, method: str, body: bytes | None, bound: bool) -> None:
    guard = connection.app.state.daemon.guard
    token = guard.check_request(
        connection.headers.get("authorization"), method, path_with_query(connection), body, bound
    )
    connection.scope[_CALL] = Call(token, body)


def _secured(op: Operation) -> Endpoint:
    body_of = reads(op)
    handler = op.endpoint

    async def endpoint(request: Request) -> Response:
        body = await read_body(request, body_of.limit) if body_of.limit else None
        _verify(request, request.method, body, body_of.bound)
        return await handler(request)

    endpoint.__name__ = handler.__name__
    return endpoint


def _secured_websocket(op: WebSocketOperation) -> Callable[[WebSocket], Awaitable[None]]:
    handler = op.endpoint

    async def endpoint(websocket: WebSocket) -> None:
        try:
            _verify(websocket, "GET", b"" if op.bound else None, op.bound)
        except ServiceError as exc:  # before accepting: the handshake gets the error
            await websocket.send_denial_response(error_response(exc))
            return
        await handler(websocket)

    return endpoint


def routes(
    operations: Sequence[Operation], websockets: Sequence[WebSocketOperation] = ()
) -> list[BaseRoute]:
    """Starlette routes of the table: every `secured` operation and every WebSocket behind
    the guard (no WebSocket of the daemon is public)."""
    http: list[BaseRoute] = [
        Route(op.path, _secured(op) if op.secured else op.endpoint, methods=[op.method])
        for op in operations
    ]
    return http + [WebSocketRoute(op.path, _secured_websocket(op)) for op in websockets]
