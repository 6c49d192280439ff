"""A sandbox's pauses (SPEC §13, files kept): E2B's `autoPause`/`autoResume` as create's
options, and its pause and resume calls.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b.control.common import _created, _owned, _refused
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.router import persistence, schemas
from sandcell.router.auth import Principal


def _lifecycle(body: dict[str, Any]) -> dict[str, Any]:
    """E2B's `autoPause` (`on_timeout: "pause"`) and `autoResume` as SPEC §13's options. A
    pause keeps the files only, whatever `autoPauseMemory` says (docs/e2b.md)."""
    out: dict[str, Any] = {}
    auto_pause = body.get("autoPause")
    if auto_pause is not None:
        if not isinstance(auto_pause, bool):
            raise _refused("autoPause", "must be a boolean")
        out["on_timeout"] = "pause" if auto_pause else "delete"
    resume = body.get("autoResume")
    if resume is not None:
        enabled = resume.get("enabled") if isinstance(resume, dict) else None
        if not isinstance(enabled, bool):
            raise _refused("autoResume", 'must be {"enabled": true|false}')
        out["auto_resume"] = enabled
    elif auto_pause:
        out["auto_resume"] = False  # E2B: a paused sandbox resumes on traffic only if asked
    return out


async def pause(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """sandcell keeps the files, never memory (SPEC §13), whatever E2B's `memory` asks;
    an already paused sandbox is E2B's 409, which its SDK reads as "already paused". So the
    key's bound on paused sandboxes, also a 409 on /v1, is E2B's 429 here: its SDK raises it
    (`RateLimitException`, naming the bound) instead of reporting an ordinary "already"."""
    record = await _owned(gateway, principal, request)
    if record.state == "paused":
        raise ServiceError(ErrorCode.CONFLICT, f"sandbox {record.id} is already paused")
    try:
        await persistence.pause_sandbox(gateway.router, record)
    except ServiceError as exc:
        if exc.code is not ErrorCode.CONFLICT or "max_paused_per_key" not in exc.details:
            raise
        raise ServiceError(ErrorCode.RATE_LIMITED, exc.message, exc.details) from None
    return Response(status_code=204)


async def resume(gateway: Gateway, principal: Principal, request: Request) -> Response:
    record = await _owned(gateway, principal, request)
    sandbox = schemas.sandbox_view(await persistence.resume_sandbox(gateway.router, record))
    return JSONResponse(await _created(gateway, sandbox, sandbox["template"]), 201)
