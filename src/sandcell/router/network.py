"""The router's network routes (SPEC §11): live egress changes, preview URLs and their relay,
WebSockets to exposed ports, and Host-based preview routing.

Plain HTTP to an exposed port needs no route here: `/v1/sandboxes/{id}/ports/{port}/<path>`
is an ordinary proxied call to the daemon, which relays it inside the cell.
"""

from __future__ import annotations

import time
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from sandcell.compat.e2b import hosts as e2b_hosts
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import parse_model, read_body
from sandcell.http.errors import error_response
from sandcell.http.hop import check_path
from sandcell.http.openapi import Operation
from sandcell.network.preview import PREVIEW_KEY_NAME, PreviewSigner, new_key
from sandcell.router import proxy, schemas
from sandcell.router.core import GONE
from sandcell.router.door import anonymous
from sandcell.router.websocket import refuse, relay
from sandcell.store import SandboxRecord

MAX_BODY = 65_536
_SBX = "/v1/sandboxes/{sandbox_id}"
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
HOST_PREFIX = "/_preview-host"  # where `PreviewHosts` routes `{port}-{id}.{domain}` requests
PREVIEW_COOKIE = "sandcell_preview"
TOKEN_PARAM = "sandcell_token"  # noqa: S105 - a query parameter's name


async def set_network(request: Request) -> Response:
    r = request.app.state.router
    _, record = await r.owned(request)
    req = parse_model(schemas.Network, await read_body(request, MAX_BODY))
    updated = await r.manager.set_network(record, req.policy())
    return JSONResponse(schemas.sandbox_view(updated))


async def preview_url(request: Request) -> Response:
    r = request.app.state.router
    _, record = await r.owned(request)
    port = _port(request.path_params["port"])
    body = await read_body(request, MAX_BODY)
    req = parse_model(schemas.PreviewUrl, body) if body.strip() else schemas.PreviewUrl()
    expires_at = int(time.time()) + req.expires_in_s
    token = (await _signer(request)).mint(record.id, port, expires_at)
    answer = {"url": f"{request.base_url}p/{token}/", "expires_at": schemas.rfc3339(expires_at)}
    if domain := getattr(request.app.state, "preview_domain", ""):
        netloc = f"{port}-{record.id}.{domain}" + (
            f":{request.url.port}" if request.url.port else ""
        )
        answer["host_url"] = f"{request.url.scheme}://{netloc}/?{TOKEN_PARAM}={token}"
    return JSONResponse(answer)


async def preview(request: Request) -> Response:
    """No API key: the token is the credential. Forged, expired, or its sandbox gone: 404."""
    token = request.path_params["token"]
    found = (await _signer(request)).verify(token)
    record = await _live(request, found[0]) if found else None
    if found is None or record is None:
        raise _no_preview()
    request.app.state.router.door.admit(request.scope, anonymous(record.owner))
    return await _relay(request, record, found[1], f"/p/{token}/")


async def preview_host(request: Request) -> Response:
    """`{port}-{id}.{preview_domain}` (rewritten by `PreviewHosts`): a preview token in the
    query is traded for a cookie on that host; then the cookie or an API key authorises."""
    sandbox_id, port = request.path_params["sandbox_id"], request.path_params["port"]
    prefix = f"{HOST_PREFIX}/{port}/{sandbox_id}"
    if (token := request.query_params.get(TOKEN_PARAM)) is not None:
        if (await _signer(request)).verify(token) != (sandbox_id, port):
            raise _no_preview()
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_PARAM]
        query = urlencode(kept)
        location = request.url.path[len(prefix) :] + (f"?{query}" if query else "")
        response = RedirectResponse(location or "/", status_code=303)
        response.set_cookie(PREVIEW_COOKIE, token, httponly=True, samesite="lax")
        return response
    record = await _host_authorized(request, sandbox_id, port)
    return await _relay(request, record, port, f"{prefix}/")


async def _host_authorized(request: Request, sandbox_id: str, port: int) -> SandboxRecord:
    r = request.app.state.router
    if request.headers.get("authorization"):
        _, record = await r.owned(request)
        return record
    cookie = request.cookies.get(PREVIEW_COOKIE, "")
    genuine = (await _signer(request)).verify(cookie) == (sandbox_id, port)
    if genuine and (record := await _live(request, sandbox_id)) is not None:
        r.door.admit(request.scope, anonymous(record.owner))
        return record
    raise _no_preview()


async def _live(conn: HTTPConnection, sandbox_id: str) -> SandboxRecord | None:
    """The sandbox a preview names, unless it is gone (a paused one wakes as for any call)."""
    record = await conn.app.state.router.store.get_sandbox(sandbox_id)
    return record if record is not None and record.state not in GONE else None


async def _relay(request: Request, record: SandboxRecord, port: int, prefix: str) -> Response:
    """To the daemon's /v1/ports/{port}/..., keeping the rest of the path byte for byte."""
    check_path(request.path_params["path"])
    target = proxy.sandbox_target(request, prefix, f"/v1/ports/{port}/")
    return await proxy.forward(request.app.state.router, request, record, target)


def _no_preview() -> ServiceError:
    return ServiceError(ErrorCode.NOT_FOUND, "no such preview (expired, invalid or deleted)")


async def port_websocket(websocket: WebSocket) -> None:
    """A WebSocket to an exposed port, with the API key; refused: the handshake fails."""
    r = websocket.app.state.router
    try:
        principal, record = await r.owned(websocket)
        port = _port(int(websocket.path_params["port"]))
        check_path(websocket.path_params["path"])
        prefix = f"/v1/sandboxes/{record.id}/ports/{port}/"
        target = proxy.sandbox_target(websocket, prefix, f"/v1/ports/{port}/")
    except ValueError:
        await refuse(websocket, error_response(ServiceError(ErrorCode.BAD_REQUEST, "bad port")))
        return
    except ServiceError as exc:
        await refuse(websocket, error_response(exc))
        return
    await relay(websocket, r, record, target, principal.name)


async def preview_websocket(websocket: WebSocket) -> None:
    """A preview URL's WebSocket: the token is the credential, the sandbox's visitors pay."""
    token = websocket.path_params["token"]
    found = (await _signer(websocket)).verify(token)
    record = await _live(websocket, found[0]) if found else None
    try:
        if found is None or record is None:
            raise _no_preview()
        check_path(websocket.path_params["path"])
        target = proxy.sandbox_target(websocket, f"/p/{token}/", f"/v1/ports/{found[1]}/")
    except ServiceError as exc:
        await refuse(websocket, error_response(exc))
        return
    r = websocket.app.state.router
    await relay(websocket, r, record, target, anonymous(record.owner))


async def _signer(request: HTTPConnection) -> PreviewSigner:
    """One key for every replica, created by whichever asks first."""
    state = request.app.state
    if getattr(state, "preview_signer", None) is None:
        key = await state.router.store.put_secret_if_absent(PREVIEW_KEY_NAME, new_key())
        state.preview_signer = PreviewSigner(key)
    return state.preview_signer


def _port(port: int) -> int:
    if not 0 < port < 65536:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"invalid port {port}", {"port": port})
    return port


class PreviewHosts:
    """ASGI wrapper for `server.preview_domain`: a request for `{port}-{id}.{domain}` is
    routed to the host-preview route, so a browser sees the app at the root of its own host
    (absolute links work) while limits, metrics and error handling stay the router's.
    E2B's ports on those hosts (49983 envd, 49999 the code interpreter) go to the E2B
    façade instead, for the sandbox the host names (`compat.e2b.hosts`)."""

    def __init__(self, app: Starlette, domain: str) -> None:
        self.app = app
        self.suffix = "." + domain.lower().strip(".")
        app.state.preview_domain = domain.lower().strip(".")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (found := self._match(scope)) is not None:
            port, sandbox_id = found
            if port in e2b_hosts.PORTS:
                routed = e2b_hosts.route(scope, sandbox_id)
                app = self.app if routed is not None else e2b_hosts.not_served(scope)
                await app(routed or scope, receive, send)
                return
            prefix = f"{HOST_PREFIX}/{port}/{sandbox_id}"
            raw = scope.get("raw_path") or scope["path"].encode()
            scope = {**scope, "path": prefix + scope["path"], "raw_path": prefix.encode() + raw}
        await self.app(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[int, str] | None:
        name = Headers(scope=scope).get("host", "").lower().rsplit(":", 1)[0]
        if not name.endswith(self.suffix):
            return None
        port, sep, sandbox_id = name[: -len(self.suffix)].partition("-")
        if not sep or not port.isdigit() or not sandbox_id or "." in sandbox_id:
            return None
        return int(port), sandbox_id


WEBSOCKET_ROUTES = (
    WebSocketRoute(f"{_SBX}/ports/{{port}}/{{path:path}}", port_websocket),
    WebSocketRoute("/p/{token}/{path:path}", preview_websocket),
)


# Before the catch-all proxy routes: the first match wins.
OPERATIONS = (
    Operation(
        "PATCH",
        f"{_SBX}/network",
        set_network,
        "Change the egress policy (new connections follow it)",
        body=schemas.Network,
        response=schemas.Sandbox,
        errors=(403, 404),
    ),
    Operation(
        "POST",
        f"{_SBX}/ports/{{port:int}}/url",
        preview_url,
        "A signed, expiring preview URL for an exposed port",
        body=schemas.PreviewUrl,
        response=schemas.PreviewUrlResponse,
        errors=(404,),
    ),
    *(
        Operation(
            method,
            "/p/{token}/{path:path}",
            preview,
            "A preview URL: relayed to the exposed port, no API key",
            secured=False,
            errors=(404, 502, 503, 504),
        )
        for method in METHODS
    ),
    *(
        Operation(
            method,
            f"{HOST_PREFIX}/{{port:int}}/{{sandbox_id}}/{{path:path}}",
            preview_host,
            "`{port}-{id}.{preview_domain}` (Host-based routing): a preview cookie or API key",
            errors=(404, 502, 503, 504),
        )
        for method in METHODS
    ),
)
