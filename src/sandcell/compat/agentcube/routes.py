"""The `/agentcube` routes: the workload manager's sessions and the router's invocations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from sandcell.compat.agentcube import control, picod
from sandcell.compat.agentcube.sessions import (
    NAMESPACE_LABEL,
    SESSION_HEADER,
    caller,
    session_sandbox,
)
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.hop import check_path
from sandcell.http.openapi import Operation
from sandcell.store import SandboxRecord

PREFIX = "/agentcube"
INVOCATIONS = "/v1/namespaces/{namespace}/code-interpreters/{name}/invocations/{path:path}"
Handler = Callable[[Request, SandboxRecord, str], Awaitable[Response]]


def _picod_handler(method: str, path: str) -> Handler:
    if path == "api/execute" and method == "POST":
        return picod.execute
    if path == "api/files" and method in ("POST", "GET"):
        return picod.upload if method == "POST" else picod.list_files
    if path.startswith("api/files/") and method == "GET":
        return picod.download
    if path == "health" and method == "GET":
        return picod.health
    raise ServiceError(ErrorCode.NOT_FOUND, f"no PicoD route {method} {path}")


async def invoke(request: Request) -> Response:
    """One PicoD call in the session of `x-agentcube-session-id`; an empty header opens a
    session first (with the API key), whose id comes back in the same header."""
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    path = request.path_params["path"]
    check_path(path)
    handler = _picod_handler(request.method, path)
    session_id = request.headers.get(SESSION_HEADER, "").strip()
    if session_id:
        record = await session_sandbox(request, session_id, await caller(request))
        if record.template != name or record.metadata.get(NAMESPACE_LABEL) != namespace:
            raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, "no such agentcube session")
    else:
        session_id, record = await control.new_session(request, name, namespace, None, {})
    response = await handler(request, record, path)
    response.headers[SESSION_HEADER] = session_id
    return response


_ERRORS = (400, 401, 404, 409, 413, 429, 502, 503, 504)
OPERATIONS = (
    Operation(
        "POST",
        f"{PREFIX}/v1/code-interpreter",
        control.create,
        "agentcube: create a code-interpreter session (a sandbox of template `name`)",
        body=control.CreateSession,
        errors=(400, 401, 403, 429, 503),
    ),
    Operation(
        "DELETE",
        f"{PREFIX}/v1/code-interpreter/sessions/{{session_id}}",
        control.delete,
        "agentcube: delete a session (its owner's API key)",
        status=204,
        errors=(401, 404),
    ),
    # Also at the root: the SDK joins its invocation path, which starts with a slash, to the
    # router URL (`urljoin`), so the URL's own path (/agentcube) is dropped on the way.
    *(
        Operation(
            method,
            prefix + INVOCATIONS,
            invoke,
            "agentcube: a PicoD call (api/execute, api/files, health) in a session",
            errors=_ERRORS,
            secured=False,  # the session id is the credential; an API key is optional
        )
        for prefix in (PREFIX, "")
        for method in ("GET", "POST")
    ),
)
