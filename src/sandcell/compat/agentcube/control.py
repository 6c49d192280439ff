"""agentcube's workload manager: code-interpreter sessions, each one a sandcell sandbox.

A code interpreter `name` is a template name (sandcell has templates where agentcube has
CodeInterpreter resources); the namespace is kept as the `agentcube.namespace` label. The TTL
becomes the sandbox's maximum lifetime, capped by the template's.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.agentcube.sessions import NAMESPACE_LABEL, session_ids, session_sandbox
from sandcell.http.bodies import parse_model, read_body
from sandcell.router import schemas
from sandcell.store import SandboxRecord

MAX_BODY = 65_536


class CreateSession(BaseModel):
    model_config = ConfigDict(extra="ignore")  # fields of later agentcube versions

    name: str = Field("my-interpreter", min_length=1, max_length=64)
    namespace: str = Field("default", min_length=1, max_length=63)
    ttl: int | None = Field(None, ge=1)
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        max_length=schemas.MAX_METADATA_ITEMS - 1,  # + the namespace
    )


async def new_session(
    request: Request, name: str, namespace: str, ttl: int | None, metadata: dict[str, Any]
) -> tuple[str, SandboxRecord]:
    """(session id, sandbox): a sandbox of template `name` for the caller's API key."""
    router = request.app.state.router
    principal = await router.principal(request)
    template = router.manager.template(name)
    labels = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    fields = {
        "template": name,
        "metadata": {**labels, NAMESPACE_LABEL: namespace},
        "max_lifetime_s": min(ttl, template.max_lifetime_s) if ttl else None,
    }
    # Through the model the sandcell API itself validates with (a bad label is a 400).
    req = parse_model(schemas.CreateSandbox, json.dumps(fields).encode())
    record = await router.create(principal, req)
    return (await session_ids(request)).mint(record.id), record


async def create(request: Request) -> Response:
    """`POST /v1/code-interpreter` → `{"sessionId"}`."""
    req = parse_model(CreateSession, await read_body(request, MAX_BODY))
    session_id, record = await new_session(request, req.name, req.namespace, req.ttl, req.metadata)
    body = {
        "sessionId": session_id,
        "sandboxId": record.id,
        "name": req.name,
        "namespace": req.namespace,
    }
    return JSONResponse(body)


async def delete(request: Request) -> Response:
    """`DELETE /v1/code-interpreter/sessions/{session_id}`: the owner's API key only."""
    router = request.app.state.router
    principal = await router.principal(request)  # a session id alone may not end a session
    record = await session_sandbox(request, request.path_params["session_id"], principal)
    await router.delete(record)
    return Response(status_code=204)
