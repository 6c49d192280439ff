"""The router's network routes (SPEC §11): live egress changes, preview URLs and their relay.

Exposed ports themselves need no route here: `/v1/sandboxes/{id}/ports/{port}/<path>` is an
ordinary proxied call to the daemon, which relays it inside the cell.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import parse_model, read_body
from sandcell.http.openapi import Operation
from sandcell.network.preview import PREVIEW_KEY_NAME, PreviewSigner, new_key
from sandcell.router import schemas

MAX_BODY = 65_536
_SBX = "/v1/sandboxes/{sandbox_id}"
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


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
    return JSONResponse(
        {"url": f"{request.base_url}p/{token}/", "expires_at": schemas.rfc3339(expires_at)}
    )


async def preview(request: Request) -> Response:
    """No API key: the token is the credential. Forged, expired, or its sandbox gone: 404."""
    r = request.app.state.router
    token = request.path_params["token"]
    found = (await _signer(request)).verify(token)
    record = await r.store.get_sandbox(found[0]) if found else None
    if found is None or record is None or record.state != "running":
        raise SandcellError(ErrorCode.NOT_FOUND, "no such preview (expired, invalid or deleted)")
    port = found[1]
    rest = request.path_params["path"]
    if any(segment in (".", "..") for segment in rest.split("/")):
        raise SandcellError(ErrorCode.BAD_REQUEST, "dot segments are not allowed in the path")
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    tail = raw[len(f"/p/{token}/") :].decode("latin-1")
    query = request.scope.get("query_string", b"").decode("latin-1")
    target = f"/v1/ports/{port}/{tail}" + (f"?{query}" if query else "")
    await r.store.touch(record.id, time.time())
    return await r.proxy.forward(request, record, f"ports/{port}/{rest}", target=target)


async def _signer(request: Request) -> PreviewSigner:
    """One key for every replica, created by whichever asks first."""
    state = request.app.state
    if getattr(state, "preview_signer", None) is None:
        key = await state.router.store.put_secret_if_absent(PREVIEW_KEY_NAME, new_key())
        state.preview_signer = PreviewSigner(key)
    return state.preview_signer


def _port(port: int) -> int:
    if not 0 < port < 65536:
        raise SandcellError(ErrorCode.BAD_REQUEST, f"invalid port {port}", {"port": port})
    return port


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
)
