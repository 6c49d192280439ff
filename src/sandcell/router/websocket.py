"""The core's WebSocket adapter: `/v1/sandboxes/{id}/<rest>` (SPEC §5, §9), port relays
and preview URLs all upgrade through `relay`.

The user's upgrade is authorised first, then the router opens its own upgrade to the
daemon (`Router.websocket`: a session held, a token bound to `GET` and the daemon's path).
Only then is the user's upgrade accepted, so every refusal (no key, another principal's
sandbox, too many sessions, a daemon's 401 or 404) is a plain HTTP answer. Messages then
flow both ways (`network.websocket.relay`) until either side goes away.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from sandcell.errors import ServiceError
from sandcell.http.errors import error_response
from sandcell.http.hop import check_path
from sandcell.network import websocket as ws
from sandcell.router.core import Router
from sandcell.router.proxy import sandbox_target
from sandcell.store import SandboxRecord


async def relay(
    websocket: WebSocket, router: Router, record: SandboxRecord, target: str, payer: str
) -> None:
    """`websocket` relayed to the daemon's `target`, paid for by `payer`'s sessions."""
    try:
        async with router.websocket(
            record, target, payer, ws.requested_subprotocols(websocket)
        ) as (upstream, activity):
            await websocket.accept(subprotocol=upstream.subprotocol)
            await ws.relay(websocket, upstream, activity.seen)
    except ServiceError as exc:
        await refuse(websocket, error_response(exc))
    except ws.Rejected as exc:  # the daemon refused: its answer is the user's
        await refuse(websocket, Response(exc.body, exc.status, media_type=exc.media_type))


async def refuse(websocket: WebSocket, response: Response) -> None:
    """An HTTP answer instead of the upgrade (or, once accepted, a close)."""
    if websocket.client_state.name == "CONNECTING":
        await websocket.send_denial_response(response)
    else:
        await websocket.close(ws.BROKEN)


async def attach(websocket: WebSocket) -> None:
    """`/v1/sandboxes/{id}/<rest>` as a WebSocket to the daemon's `/v1/<rest>`."""
    r: Router = websocket.app.state.router
    try:
        principal, record = await r.owned(websocket)
        check_path(websocket.path_params["rest"])
        target = sandbox_target(websocket, f"/v1/sandboxes/{record.id}/")
    except ServiceError as exc:
        await refuse(websocket, error_response(exc))
        return
    await relay(websocket, r, record, target, principal.name)


ROUTE = WebSocketRoute("/v1/sandboxes/{sandbox_id}/{rest:path}", attach)
