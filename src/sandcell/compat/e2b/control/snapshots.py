"""E2B's snapshots (SPEC §13, the workspace's files): taken, listed and deleted (as E2B's
templates), and the fork of a sandbox into `count` children from one snapshot.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.control.common import MAX_BODY, _created, _owned, _refused, _timeout
from sandcell.compat.e2b.control.listing import _page
from sandcell.compat.e2b.control.metrics import Samples
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import STATUS, ErrorCode, ServiceError
from sandcell.manager.manager import within_lifetime
from sandcell.router import persistence, schemas
from sandcell.router.auth import Principal
from sandcell.store import SnapshotRecord

SNAPSHOT = re.compile(schemas.SNAPSHOT_ID)

MAX_FORKS = 20  # E2B's bound on count


def _snapshot_info(record: SnapshotRecord) -> dict[str, Any]:
    return {"snapshotID": record.id, "names": [record.name] if record.name else []}


def _files_only(body: dict[str, Any]) -> None:
    memory = body.get("memory")
    if memory is not None and not isinstance(memory, bool):
        raise _refused("memory", "must be a boolean")


async def create_snapshot(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """SPEC §13's snapshot: the workspace's files (never memory, whatever `mode` says)."""
    record = await _owned(gateway, principal, request)
    body = await json_body(request, MAX_BODY)
    if not isinstance(body, dict):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    _files_only(body)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 128):
        raise _refused("name", "must be a string of at most 128 characters")
    snapshot = await gateway.router.manager.snapshots.take(principal.name, record.id, name)
    return JSONResponse(_snapshot_info(snapshot), 201)


async def list_snapshots(gateway: Gateway, principal: Principal, request: Request) -> Response:
    records = await gateway.router.store.list_snapshots(None if principal.admin else principal.name)
    records.sort(key=lambda r: (r.created_at, r.id))
    if sandbox_id := request.query_params.get("sandboxID"):
        records = [r for r in records if r.sandbox_id == sandbox_id]
    if name := request.query_params.get("name"):
        records = [r for r in records if r.name == name]
    page, headers = _page(request, records, lambda r: f"{r.created_at:017.6f}/{r.id}")
    return JSONResponse([_snapshot_info(r) for r in page], headers=headers)


async def delete_snapshot(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """E2B deletes a snapshot as a template (`DELETE /templates/{id}`); only snapshot ids
    name something here (a template is the operator's configuration)."""
    template_id = request.path_params["template_id"]
    if not SNAPSHOT.match(template_id):
        raise ServiceError(
            ErrorCode.NOT_FOUND, f"{template_id} is not a snapshot; templates are configured"
        )
    owner = None if principal.admin else principal.name
    record = await gateway.router.manager.snapshots.owned(owner, template_id)
    await gateway.router.manager.snapshots.delete(record)
    return Response(status_code=204)


async def fork(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """SPEC §13's fork, `count` times from one snapshot of the parent's files; each child
    has the parent's settings and succeeds or fails on its own, as E2B answers."""
    parent = await _owned(gateway, principal, request)
    body = await json_body(request, MAX_BODY)
    if not isinstance(body, dict):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    timeout = _timeout(body)
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FORKS:
        raise _refused("count", f"must be an integer from 1 to {MAX_FORKS}")
    router = gateway.router
    if timeout is not None:
        within_lifetime(router.manager.template(parent.template), timeout=timeout)
    snapshot = await router.manager.snapshots.take(parent.owner, parent.id, f"fork of {parent.id}")
    results: list[dict[str, Any]] = []
    try:
        for _ in range(count):
            try:
                reservation = await router.reserve(parent.owner)
                child = await persistence.child_of(router, parent, snapshot, reservation, timeout)
                view = schemas.sandbox_view(child)
                Samples.of(router).watch(child.id)
                results.append({"sandbox": await _created(gateway, view, parent.template)})
            except ServiceError as exc:
                results.append(
                    {"error": {"code": STATUS.get(exc.code, 500), "message": exc.message}}
                )
    finally:
        await router.manager.snapshots.delete(snapshot)
    return JSONResponse(results, 201)
