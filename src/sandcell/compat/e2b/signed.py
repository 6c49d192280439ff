"""E2B's signed file URLs: `upload_url` / `download_url` (SPEC §14.2).

The SDK signs a file URL with the sandbox's access token: `v1_` and the unpadded base64 of
SHA-256 over `path:operation:username:token[:expiration]` (operation `read` for GET,
`write` for POST), and puts `signature` (and `signature_expiration`, Unix seconds) in the
query. It joins `/files` to the sandbox URL with `urljoin`, which drops `/e2b`, so such
a URL arrives at the server's root and names no sandbox; through Host routing
(`49983-{id}.{domain}`, see `router.network.PreviewHosts`) it arrives at `/e2b/files` with
its sandbox named.

A sandbox has one token, rebuilt from its id (`tokens`), so a signature is checked by
rebuilding it: for the named sandbox, or at the root for each live sandbox in turn (one
HMAC, one SHA-256 and a constant-time comparison each: the work is bounded by the number of
live sandboxes). The signature binds the sandbox, the path and user as written in the
query, the operation and the expiry; a signature that matches none is "invalid", one that
matches but has expired is "already expired", in envd's words and order (so a forger never
learns whether the expiry was the problem). The files are then read or written by the same
code as the façade's envd `/files` (`files`), through the router core.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.compat.e2b import errors, files
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.openapi import Operation, Query
from sandcell.router.core import GONE
from sandcell.router.door import anonymous
from sandcell.store import SandboxRecord

OPERATION = {"GET": "read", "POST": "write"}
# The keyless callers at the root pay from one account of their own while their signature
# is looked for (they name no sandbox, so no owner yet): a flood of forged URLs holds at most
# that account's slots, never an owner's or the keyed callers'.
SEARCHING = anonymous("e2b-signed-urls")
YIELD_EVERY = 256  # candidates tried between two turns of the event loop
SCHEME = {
    "type": "apiKey",
    "in": "query",
    "name": "signature",
    "description": "an E2B signed file URL's signature (upload_url / download_url)",
}


def signature(path: str, operation: str, username: str, token: str, expiration: int | None) -> str:
    """The signature the SDK makes (`e2b.sandbox.signature.get_signature`)."""
    fields = [path, operation, username, token] + ([] if expiration is None else [str(expiration)])
    digest = hashlib.sha256(":".join(fields).encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode()


def _refused(message: str) -> ServiceError:
    return ServiceError(ErrorCode.UNAUTHENTICATED, message)


def _expiration(request: Request) -> int | None:
    raw = request.query_params.get("signature_expiration")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ServiceError(
            ErrorCode.BAD_REQUEST,
            "signature_expiration must be an integer (Unix seconds)",
            {"field": "signature_expiration"},
        ) from None


async def signed_record(
    gateway: Gateway, request: Request, sandbox_id: str | None
) -> SandboxRecord:
    """The live sandbox whose token signed this request's URL: `sandbox_id`'s, or (None) the
    one among all live sandboxes. The caller is admitted as that sandbox's keyless visitor."""
    query = request.query_params
    presented = query.get("signature")
    if presented is None:
        raise _refused("missing signature query parameter")
    if request.method not in OPERATION:
        raise _refused(f"a signed URL serves GET and POST, not {request.method}")
    expiration = _expiration(request)  # a malformed one is a 400 before any search
    material = (query.get("path", ""), OPERATION[request.method], query.get("username", ""))
    store = gateway.router.store
    if sandbox_id is not None:
        one = await store.get_sandbox(sandbox_id)
        live = [one] if one is not None and one.state not in GONE else []
        tokens = {sandbox_id: await gateway.tokens.mint(sandbox_id)}
    else:
        gateway.router.door.admit(request.scope, SEARCHING)
        live = [record for record in await store.list_sandboxes() if record.state not in GONE]
        tokens = await gateway.tokens.of_each(record.id for record in live)
    found = None
    for n, record in enumerate(live, 1):
        expected = signature(*material, tokens[record.id], expiration)
        if hmac.compare_digest(expected.encode(), presented.encode()):
            found = record
            break
        if n % YIELD_EVERY == 0:  # a long search leaves the event loop to other requests
            await asyncio.sleep(0)
    if found is None:
        raise _refused("invalid signature")
    if expiration is not None and expiration < int(time.time()):
        raise _refused("signature is already expired")
    gateway.router.door.admit(request.scope, anonymous(found.owner))  # a no-op at the root
    return found


Handler = Callable[[Gateway, SandboxRecord, Request], Awaitable[Response]]


def _at_root(name: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            gateway = Gateway.of(request)
            return await handler(gateway, await signed_record(gateway, request, None), request)
        except ServiceError as exc:
            return errors.rest_error(exc)

    endpoint.__name__ = endpoint.__qualname__ = f"e2b_signed_{name}"
    return endpoint


async def _not_served(request: Request) -> Response:
    """Another method on the root's /files: E2B's 405, as under /e2b."""
    message = f"{request.method} /files is not served"
    error = ServiceError(ErrorCode.METHOD_NOT_ALLOWED, message, headers={"Allow": "GET, POST"})
    return errors.rest_error(error)


NOT_SERVED = Route("/files", _not_served, methods=("PUT", "DELETE", "PATCH", "OPTIONS"))

_QUERY = (
    Query("path", {"type": "string"}, description="as signed (relative to /home/user or absolute)"),
    Query("username", {"type": "string"}, description="as signed"),
    Query("signature_expiration", {"type": "integer"}, description="Unix seconds, as signed"),
)
_ERRORS = (400, 401, 403, 404, 409, 413, 429, 502, 503, 504)

_OCTETS = "application/octet-stream"


def _signed(
    method: str,
    name: str,
    handler: Handler,
    summary: str,
    body: str | None = None,
    response: str | None = None,
) -> Operation:
    """An operation of the signed `/files` URL: its query, errors and credential."""
    return Operation(
        method,
        "/files",
        _at_root(name, handler),
        summary,
        body=body,
        response=response,
        query=_QUERY,
        errors=_ERRORS,
        security=("e2bFileSignature",),
        error_body=errors.RestError,
    )


# At the root, where the SDK's URL lands (served beside /e2b, not under it).
OPERATIONS = (
    _signed(
        "GET",
        "download",
        files.download,
        "E2B signed download URL (download_url): the signature is the credential",
        response=_OCTETS,
    ),
    _signed(
        "POST",
        "upload",
        files.upload,
        "E2B signed upload URL (upload_url): a multipart form or octet-stream body",
        body=_OCTETS,
    ),
)
