"""What the handlers of E2B's control API share: its views of a sandbox (SandboxDetail and
the Sandbox that create, connect and resume answer), the caller's own sandbox by its path,
and the checks of the fields more than one call takes (`templateID`, `timeout`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.templates import Template
from sandcell.router import schemas
from sandcell.router.auth import Principal
from sandcell.store import SandboxRecord

ENVD_VERSION = "0.6.4"  # docs/e2b.md, "The envd version it reports"

CLIENT_ID = "sandcell"

TEMPLATES = {"base": "default", "code-interpreter-v1": "code-interpreter"}

MAX_BODY = 1_048_576

MAX_TIMEOUT_S = 604_800  # as /v1's idle_timeout_s

DEFAULT_TIMEOUT_S = 300  # E2B's, when connect names none

Handler = Callable[[Gateway, Principal, Request], Awaitable[Response]]


def _template(name: Any) -> str:
    name = name or "base"
    if not isinstance(name, str):
        raise ServiceError(ErrorCode.BAD_REQUEST, "templateID must be a string")
    return TEMPLATES.get(name, name)


def _detail(sandbox: dict[str, Any], template: Template) -> dict[str, Any]:
    """E2B's SandboxDetail (and ListedSandbox) for a sandcell sandbox. E2B knows two states;
    a sandbox being created, deleted or failed is not `running`."""
    return {
        "templateID": sandbox["template"],
        "sandboxID": sandbox["id"],
        "clientID": CLIENT_ID,
        "startedAt": sandbox["created_at"],
        "endAt": sandbox["expires_at"],
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, math.ceil(template.cpus)),
        "memoryMB": template.memory_mb,
        "diskSizeMB": template.disk_mb,
        "metadata": {k: str(v) for k, v in (sandbox.get("metadata") or {}).items()},
        "state": "running" if sandbox["state"] == "running" else "paused",
    }


async def _created(gateway: Gateway, sandbox: dict[str, Any], template: str) -> dict[str, Any]:
    token = await gateway.tokens.mint(sandbox["id"])
    return {
        "templateID": template,
        "sandboxID": sandbox["id"],
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        # e2b-code-interpreter sends only this one on its /contexts calls: the same secret.
        "trafficAccessToken": token,
        # The SDK's `get_host(port)` is `{port}-{id}.{domain}`: sandcell's preview domain,
        # where Host routing serves them (None: the client's E2B_DOMAIN).
        "domain": gateway.domain or None,
    }


def _timeout(body: dict[str, Any], least: int = 1) -> int | None:
    value = body.get("timeout")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= MAX_TIMEOUT_S:
        raise ServiceError(
            ErrorCode.BAD_REQUEST, f"timeout must be an integer from {least} to {MAX_TIMEOUT_S}"
        )
    return value


def _refused(field: str, why: str) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, f"{field}: {why}", {"field": field})


async def _owned(gateway: Gateway, principal: Principal, request: Request) -> SandboxRecord:
    return await gateway.router.sandbox_of(principal, request.path_params["sandbox_id"])


def _view(gateway: Gateway, record: SandboxRecord) -> dict[str, Any]:
    templates = gateway.router.manager.templates
    sandbox = schemas.sandbox_view(record)
    return _detail(sandbox, templates.get(sandbox["template"], Template()))
