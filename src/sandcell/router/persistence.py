"""The router's persistence routes (SPEC §13): pause, resume, snapshots, fork, and waking a
paused sandbox that a proxied request reaches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.audit.trail import recorded
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import parse_model, read_body
from sandcell.http.openapi import Operation
from sandcell.router import schemas
from sandcell.store import Reservation, SandboxRecord, SnapshotRecord

if TYPE_CHECKING:
    from sandcell.router.core import Router

_SBX = "/v1/sandboxes/{sandbox_id}"
MAX_BODY = 4096


async def pause(request: Request) -> Response:
    r: Router = request.app.state.router
    _, record = await r.owned(request)
    return JSONResponse(schemas.sandbox_view(await pause_sandbox(r, record)))


async def pause_sandbox(r: Router, record: SandboxRecord) -> SandboxRecord:
    r.hop.forget(record)  # its session key and connections die with the cell
    return await r.manager.persistence.pause(record.id)


async def resume(request: Request) -> Response:
    r: Router = request.app.state.router
    _, record = await r.owned(request)
    return JSONResponse(schemas.sandbox_view(await resume_sandbox(r, record)))


async def wake(r: Router, record: SandboxRecord) -> SandboxRecord:
    """The running sandbox a proxied request goes to, once a move or snapshot under way has
    ended: a paused one is resumed first if it was created with auto_resume, else 409
    SANDBOX_PAUSED."""
    record = await r.manager.persistence.settled(record.id)
    if record.state == "running":
        return record
    if record.state == "paused":
        if not record.auto_resume:
            raise ServiceError(
                ErrorCode.SANDBOX_PAUSED,
                f"sandbox {record.id} is paused; resume it first",
                {"sandbox_id": record.id, "state": record.state},
            )
        return await resume_sandbox(r, record)
    raise ServiceError(ErrorCode.CONFLICT, f"sandbox {record.id} is {record.state}")


async def resume_sandbox(r: Router, record: SandboxRecord) -> SandboxRecord:
    """A resumed sandbox is live again: it needs one of its owner's slots (429 without),
    held until the resume has counted it (a running one needs none)."""
    r.hop.forget(record)  # a new cell: a new session key and endpoint
    if record.state == "running":
        return record
    reservation = await r.reserve(record.owner)
    try:
        return await r.manager.persistence.resume(record.id)
    finally:
        await r.store.release_reservation(reservation)


async def take_snapshot(request: Request) -> Response:
    r: Router = request.app.state.router
    principal, record = await r.owned(request)
    body = await read_body(request, MAX_BODY)
    req = parse_model(schemas.CreateSnapshot, body) if body.strip() else schemas.CreateSnapshot()
    snapshot = await r.manager.snapshots.take(principal.name, record.id, req.name)
    return JSONResponse(schemas.snapshot_view(snapshot), status_code=201)


async def list_snapshots(request: Request) -> Response:
    r: Router = request.app.state.router
    principal = await r.principal(request)
    records = await r.store.list_snapshots(None if principal.admin else principal.name)
    return JSONResponse({"snapshots": [schemas.snapshot_view(s) for s in records]})


async def delete_snapshot(request: Request) -> Response:
    r: Router = request.app.state.router
    principal = await r.principal(request)
    owner = None if principal.admin else principal.name
    record = await r.manager.snapshots.owned(owner, request.path_params["snapshot_id"])
    await r.manager.snapshots.delete(record)
    return Response(status_code=204)


async def fork(request: Request) -> Response:
    """A snapshot and a sandbox started from it, with the parent's settings; the snapshot
    goes once the fork has its own copy (it counts against the quota only meanwhile)."""
    r: Router = request.app.state.router
    _, parent = await r.owned(request)
    reservation = await r.reserve(parent.owner)
    try:
        snapshot = await r.manager.snapshots.take(parent.owner, parent.id, f"fork of {parent.id}")
    except BaseException:
        await r.store.release_reservation(reservation)
        raise
    try:
        child = await child_of(r, parent, snapshot, reservation)
    finally:
        await r.manager.snapshots.delete(snapshot)
    return JSONResponse(schemas.sandbox_view(child), status_code=201)


async def child_of(
    r: Router,
    parent: SandboxRecord,
    snapshot: SnapshotRecord,
    reservation: Reservation,
    timeout_s: int | None = None,
) -> SandboxRecord:
    """A sandbox on `snapshot` of `parent`, with the parent's settings (every fork, on /v1
    and through the façade, makes its children here); `timeout_s` replaces the parent's
    idle timeout and bounds the child's lifetime."""
    with recorded(r.audit, "sandbox.fork", parent.id, {"snapshot": snapshot.id}) as touched:
        child = await _child(r, parent, snapshot, reservation, timeout_s)
        touched["child"] = child.id
    return child


async def _child(
    r: Router,
    parent: SandboxRecord,
    snapshot: SnapshotRecord,
    reservation: Reservation,
    timeout_s: int | None,
) -> SandboxRecord:
    from sandcell.secrets.grants import regrant

    env, secrets = await regrant(r.store, parent)  # placeholders of the child's own
    return await r.manager.create_sandbox(
        parent.owner,
        parent.template,
        idle_timeout_s=timeout_s or parent.idle_timeout_s,
        max_lifetime_s=timeout_s,
        env=env,
        metadata=parent.metadata,
        network=parent.network or None,
        secrets=secrets,
        reservation=reservation,
        auto_resume=parent.auto_resume,
        on_timeout=parent.on_timeout,
        snapshot=snapshot,
        resources=parent.resources,
    )


OPERATIONS = (
    Operation(
        "POST",
        f"{_SBX}/pause",
        pause,
        "Pause a sandbox: its processes end, its workspace is kept (memory is not)",
        response=schemas.Sandbox,
        errors=(404, 409, 501),
    ),
    Operation(
        "POST",
        f"{_SBX}/resume",
        resume,
        "Resume a paused sandbox in a new cell, on its kept workspace",
        response=schemas.Sandbox,
        errors=(404, 409, 501, 503),
    ),
    Operation(
        "POST",
        f"{_SBX}/snapshots",
        take_snapshot,
        "Snapshot a sandbox's workspace (its processes frozen meanwhile; memory is not kept)",
        body=schemas.CreateSnapshot,
        response=schemas.Snapshot,
        status=201,
        errors=(404, 409, 413, 501, 503),
    ),
    Operation(
        "POST",
        f"{_SBX}/fork",
        fork,
        "A new sandbox on a copy of this one's workspace",
        response=schemas.Sandbox,
        status=201,
        errors=(404, 409, 413, 429, 501, 503),
    ),
    Operation(
        "GET", "/v1/snapshots", list_snapshots, "List your snapshots", response=schemas.SnapshotList
    ),
    Operation(
        "DELETE",
        "/v1/snapshots/{snapshot_id}",
        delete_snapshot,
        "Delete a snapshot",
        status=204,
        errors=(404,),
    ),
)
