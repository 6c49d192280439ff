"""`GET /v1/sandboxes/{id}/metrics`: what a sandbox uses, from the backend (not proxied)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.errors import ErrorCode, ServiceError
from sandcell.store import SandboxRecord

if TYPE_CHECKING:
    from sandcell.router.core import Router

MIB = 1_048_576


class SandboxMetrics(BaseModel):
    """Figures the backend cannot read (a cell without a cgroup) are null."""

    cpu_used_s: float | None
    cpu_percent: float | None
    cpus: float
    memory_bytes: int | None
    memory_limit_bytes: int
    pids: int | None
    pids_limit: int
    disk_used_bytes: int
    disk_limit_bytes: int
    at: str


async def sandbox_metrics(request: Request) -> Response:
    r = request.app.state.router
    _, record = await r.owned(request)
    return JSONResponse((await metrics_of(r, record)).model_dump())


async def metrics_of(r: Router, record: SandboxRecord) -> SandboxMetrics:
    """What the backend reads of a running sandbox's cell."""
    if record.state != "running":
        raise ServiceError(ErrorCode.CONFLICT, f"sandbox {record.id} is {record.state}")
    used = await r.manager.backend.usage(record.cell)
    template = r.manager.template(record.template)
    own = template.resources(record.resources)  # the create's, within the template's max_*
    return SandboxMetrics(
        cpu_used_s=used.cpu_used_s,
        cpu_percent=used.cpu_percent,
        cpus=own["cpus"],
        memory_bytes=used.memory_bytes,
        memory_limit_bytes=own["memory_mb"] * MIB,
        pids=used.pids,
        pids_limit=template.pids_max,
        disk_used_bytes=used.disk_used_bytes,
        disk_limit_bytes=own["disk_mb"] * MIB,
        at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    )
