"""E2B's sandboxes: created (each field of create taking effect or refused by name, SPEC
§14.2), described, listed, killed, connected to, and given a new timeout.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.control.common import (
    DEFAULT_TIMEOUT_S,
    MAX_BODY,
    _created,
    _owned,
    _refused,
    _template,
    _timeout,
    _view,
)
from sandcell.compat.e2b.control.lifecycle import _lifecycle
from sandcell.compat.e2b.control.listing import _filter, _page, _sandbox_key, descending
from sandcell.compat.e2b.control.metrics import Samples
from sandcell.compat.e2b.control.network import _network, _within_max
from sandcell.compat.e2b.control.secrets import filled
from sandcell.compat.e2b.control.snapshots import SNAPSHOT
from sandcell.compat.e2b.gateway import Gateway
from sandcell.compat.e2b.paths import SANDBOX_ENV
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import parse_model
from sandcell.router import persistence, schemas
from sandcell.router.auth import Principal

# Read by create, or harmless: `secure` asks for envd's access token, which sandcell always
# requires; `iam` without tokens and `volumeMounts: []` ask for nothing. `mcp` asks E2B's API
# for nothing either (it records the servers' names): the SDK itself starts the gateway, with
# `mcp-gateway --config ...` in the new sandbox, and kills it saying why when that fails.
CREATE_FIELDS = frozenset(
    {"templateID", "timeout", "envVars", "metadata", "autoPause", "autoPauseMemory"}
    | {"autoResume", "allow_internet_access", "network", "secure", "mcp", "iam", "volumeMounts"}
)


def _harmless(body: dict[str, Any]) -> None:
    for field in sorted(set(body) - CREATE_FIELDS):
        raise _refused(field, "sandcell does not know this field of E2B's create")
    if body.get("mcp") is not None and not isinstance(body["mcp"], dict):
        raise _refused("mcp", "must be an object of MCP servers")
    iam = body.get("iam")
    if iam not in (None, {}) and (not isinstance(iam, dict) or iam.get("tokens")):
        raise _refused("iam", "sandcell has no workload identity tokens (see SPEC §17 secrets)")
    if body.get("volumeMounts") not in (None, []):
        raise _refused("volumeMounts", "sandcell has no volumes; snapshots keep files (§13)")
    if body.get("secure") not in (None, True, False):
        raise _refused("secure", "must be a boolean")


async def create(gateway: Gateway, principal: Principal, request: Request) -> Response:
    body = await json_body(request, MAX_BODY)
    if not isinstance(body, dict):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    _harmless(body)
    template = _template(body.get("templateID"))
    snapshot = None
    if SNAPSHOT.match(template):  # E2B starts a sandbox from a snapshot by its id
        snapshot = await gateway.router.manager.snapshots.owned(
            None if principal.admin else principal.name, template
        )
        template = snapshot.template
    env, secrets = filled(body.get("envVars") or {})  # Secret.fill: the sandbox's secrets
    create: dict[str, Any] = {
        "template": template,
        **({"snapshot": snapshot.id} if snapshot else {}),
        "env": {**SANDBOX_ENV, **env},  # HOME: /home/user (§14.2)
        "metadata": body.get("metadata") or {},
        **({"secrets": secrets} if secrets else {}),
        **_lifecycle(body),
    }
    network = _network(body, "")
    _within_max(gateway.router.manager.template(template), template, network, "")
    if network is not None:
        create["network"] = network
    if (timeout := _timeout(body)) is not None:
        # E2B's timeout is a deadline from now: the lifetime, and no idle end before it.
        create["idle_timeout_s"] = create["max_lifetime_s"] = timeout
    req = parse_model(schemas.CreateSandbox, json.dumps(create).encode())
    sandbox = schemas.sandbox_view(await gateway.router.create(principal, req))
    Samples.of(gateway.router).watch(sandbox["id"])
    return JSONResponse(await _created(gateway, sandbox, body.get("templateID") or "base"), 201)


async def describe(gateway: Gateway, principal: Principal, request: Request) -> Response:
    return JSONResponse(_view(gateway, await _owned(gateway, principal, request)))


async def list_sandboxes(gateway: Gateway, principal: Principal, request: Request) -> Response:
    records = await gateway.router.store.list_sandboxes(None if principal.admin else principal.name)
    rows = _filter([_view(gateway, r) for r in records if r.state != "deleted"], request)
    page, headers = _page(request, rows, _sandbox_key, descending(request, "desc"))
    return JSONResponse(page, headers=headers)


async def kill(gateway: Gateway, principal: Principal, request: Request) -> Response:
    await gateway.router.delete(await _owned(gateway, principal, request))
    return Response(status_code=204)


async def set_timeout(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """E2B's timeout is a deadline: the sandbox ends `timeout` from now, sooner or later;
    0 (E2B's "time out now", which its tests use to force an auto-pause) a second from now,
    the soonest end the reaper keeps."""
    record = await _owned(gateway, principal, request)
    timeout = _timeout(await json_body(request, MAX_BODY), least=0)
    if timeout is None:
        raise _refused("timeout", "is required")
    await gateway.router.set_end(record, max(timeout, 1))
    return Response(status_code=204)


async def connect(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """As E2B: a running sandbox's end moves to `timeout` from now if that is later (E2B's
    default timeout, 300 s, when none is given); a paused one resumes with that end, and
    one being paused (its timeout's pause, say) once the pause is done."""
    record = await _owned(gateway, principal, request)
    record = await gateway.router.manager.persistence.settled(record.id)
    timeout = _timeout(await json_body(request, MAX_BODY)) or DEFAULT_TIMEOUT_S
    was_running = record.state == "running"
    if record.state == "paused":  # connecting resumes it, auto_resume or not (as E2B)
        record = await persistence.resume_sandbox(gateway.router, record)
    ended = await gateway.router.set_end(record, timeout, extend_only=was_running)
    Samples.of(gateway.router).watch(record.id)
    sandbox = schemas.sandbox_view(ended)
    return JSONResponse(await _created(gateway, sandbox, sandbox["template"]), 200)
