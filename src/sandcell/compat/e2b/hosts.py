"""E2B's per-sandbox hosts (SPEC §14.2): with `server.preview_domain` set, E2B's SDKs build
`{port}-{id}.{domain}` for a sandbox's ports (`get_host`), and reach envd (49983) and the code
interpreter (49999) there when no `E2B_SANDBOX_URL` is set. `router.network.PreviewHosts`
hands requests for those two ports here, and they are served by the façade's own table under
`/e2b`, with the sandbox named by the host: whatever `E2b-Sandbox-Id` the caller sent is
replaced, so the host decides which sandbox's token the call must carry. The control API is
not served on a sandbox's host (E2B serves it at `api.{domain}`), nor are other ports' paths.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Scope

from sandcell.compat.e2b import PREFIX, control, errors
from sandcell.errors import ErrorCode, ServiceError

ENVD_PORT = 49983
INTERPRETER_PORT = 49999
PORTS = frozenset({ENVD_PORT, INTERPRETER_PORT})
# The control API's first path segments (/sandboxes, /v2, /snapshots, /templates).
_CONTROL = frozenset(op.path.split("/")[1] for op in control.OPERATIONS)
_SANDBOX_ID = b"e2b-sandbox-id"


def not_served(scope: Scope) -> ASGIApp:
    """E2B's 404 for a path `route` does not take."""
    message = f"{scope['path']} is not served on a sandbox's host"
    return errors.rest_error(ServiceError(ErrorCode.NOT_FOUND, message))


def route(scope: Scope, sandbox_id: str) -> Scope | None:
    """`scope` for the façade: its path under /e2b, the sandbox named by the host (None for
    a control path)."""
    path = scope["path"]
    if path.split("/")[1] in _CONTROL:
        return None
    raw = scope.get("raw_path") or path.encode()
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != _SANDBOX_ID]
    headers.append((_SANDBOX_ID, sandbox_id.encode("latin-1")))
    return {
        **scope,
        "path": PREFIX + path,
        "raw_path": PREFIX.encode() + raw,
        "headers": headers,
    }
