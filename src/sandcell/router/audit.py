"""`GET /v1/audit` (SPEC §20): a page of the audit trail, oldest first. A caller reads its
own records (those naming its principal, its sandboxes' egress and secret uses included);
an admin key reads everyone's, and may narrow to one `principal`. The writer's pending
records are stored first, so a caller sees its own last action."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.audit.records import ACTIONS, MAX_PAGE, AuditQuery
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.openapi import Operation

if TYPE_CHECKING:
    from sandcell.router.core import Router

PARAMS = frozenset({"sandbox", "action", "principal", "since", "until", "after", "limit"})
MAX_PARAM = 256


def _bad(name: str, why: str) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, f"{name}: {why}", {"param": name})


def _time(name: str, value: str | None) -> float | None:
    """Epoch seconds, or an ISO 8601 time with its offset (e.g. 2026-12-02T06:00:00Z)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise _bad(name, "epoch seconds or an ISO 8601 time, e.g. 2026-12-02T06:00:00Z") from None
    if at.tzinfo is None:
        raise _bad(name, "an ISO 8601 time needs its offset, e.g. Z or +01:00")
    return at.timestamp()


def query_of(request: Request, principal: str, admin: bool) -> AuditQuery:
    params = request.query_params
    for name in params:
        if name not in PARAMS:
            raise _bad(name, f"unknown parameter; known: {sorted(PARAMS)}")
        if len(params.getlist(name)) > 1:
            raise _bad(name, "given more than once")
        if len(params[name]) > MAX_PARAM:
            raise _bad(name, f"longer than {MAX_PARAM} characters")
    action = params.get("action")
    if action is not None and action not in ACTIONS:
        raise _bad("action", f"unknown action; known: {sorted(ACTIONS)}")
    who = params.get("principal")
    if who is not None and not admin and who != principal:
        raise ServiceError(ErrorCode.FORBIDDEN, "only an admin key reads other principals' records")
    limit = params.get("limit", "100")
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_PAGE:
        raise _bad("limit", f"an integer from 1 to {MAX_PAGE}")
    try:
        return AuditQuery(
            sandbox_id=params.get("sandbox"),
            action=action,
            principal=who if admin else principal,
            since=_time("since", params.get("since")),
            until=_time("until", params.get("until")),
            after=params.get("after"),
            limit=int(limit),
        )
    except ValueError as exc:
        raise _bad("after", str(exc)) from None


async def list_audit(request: Request) -> Response:
    r: Router = request.app.state.router
    principal = await r.principal(request)
    query = query_of(request, principal.name, principal.admin)
    if r.audit is not None:
        await r.audit.flush()
    page = await r.store.list_audit(query)
    return JSONResponse({"records": [rec.to_dict() for rec in page.records], "next": page.next})


OPERATIONS = (
    Operation(
        "GET",
        "/v1/audit",
        list_audit,
        "Audit records, oldest first: sandbox, action, principal (admin), since, until "
        "(epoch seconds or ISO 8601), after (the last page's `next`), limit",
        errors=(400, 403),
    ),
)
