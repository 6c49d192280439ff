"""The router's persistence routes (SPEC §13): pause, resume, and waking a paused sandbox
that a proxied request reaches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.openapi import Operation
from sandcell.router import schemas
from sandcell.store import SandboxRecord

if TYPE_CHECKING:
    from sandcell.router.app import Router

_SBX = "/v1/sandboxes/{sandbox_id}"


async def pause(request: Request) -> Response:
    r: Router = request.app.state.router
    _, record = await r.owned(request)
    r.proxy.forget(record)  # its session key and connections die with the cell
    paused = await r.manager.persistence.pause(record.id)
    return JSONResponse(schemas.sandbox_view(paused))


async def resume(request: Request) -> Response:
    r: Router = request.app.state.router
    _, record = await r.owned(request)
    return JSONResponse(schemas.sandbox_view(await _resume(r, record)))


async def wake(r: Router, record: SandboxRecord) -> SandboxRecord:
    """The running sandbox a proxied request goes to: a paused one is resumed first if it
    was created with auto_resume, else 409 SANDBOX_PAUSED."""
    if record.state in ("paused", "pausing", "resuming"):
        if not record.auto_resume:
            raise SandcellError(
                ErrorCode.SANDBOX_PAUSED,
                f"sandbox {record.id} is paused; resume it first",
                {"sandbox_id": record.id, "state": record.state},
            )
        return await _resume(r, record)
    raise SandcellError(ErrorCode.CONFLICT, f"sandbox {record.id} is {record.state}")


async def _resume(r: Router, record: SandboxRecord) -> SandboxRecord:
    r.proxy.forget(record)  # a new cell: a new session key and endpoint
    return await r.manager.persistence.resume(record.id)


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
)
