"""E2B's control API (`E2B_API_URL`): sandboxes created, listed, killed and kept alive by
the router's own operations, for the principal of the caller's key (`X-API-KEY`)."""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import parse_model
from sandcell.manager.templates import Template
from sandcell.router import persistence, schemas
from sandcell.router.auth import Principal
from sandcell.router.usage import metrics_of
from sandcell.store import SandboxRecord

ENVD_VERSION = "0.5.7"
CLIENT_ID = "sandcell"
TEMPLATES = {"base": "default", "code-interpreter-v1": "code-interpreter"}
MAX_BODY = 1_048_576
HEX_KEY = re.compile(r"\Ae2b_(?:[0-9a-f]{2})+\Z")


def _template(name: Any) -> str:
    name = name or "base"
    if not isinstance(name, str):
        raise SandcellError(ErrorCode.BAD_REQUEST, "templateID must be a string")
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
        "domain": None,
    }


def _timeout(body: dict[str, Any]) -> int | None:
    value = body.get("timeout")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SandcellError(ErrorCode.BAD_REQUEST, "timeout must be a positive integer")
    return value


def _matches(row: dict[str, Any], request: Request) -> bool:
    """E2B's list filters: `metadata` (an urlencoded `k=v&...` string) and `state`."""
    # The SDK quotes each key and value, then urlencodes the lot: two decodings.
    pairs = parse_qsl(request.query_params.get("metadata", ""))
    wanted = [(unquote(k), unquote(v)) for k, v in pairs]
    states = request.query_params.get("state")
    if states and row["state"] not in states.split(","):
        return False
    return all(row["metadata"].get(k) == v for k, v in wanted)


def sandcell_key(api_key: str) -> str:
    """The sandcell key in an `X-API-KEY`: as given, or hex-encoded behind `e2b_`, the only
    form some e2b versions (2.2x-2.3x) let through their own format check."""
    if HEX_KEY.match(api_key):
        with contextlib.suppress(ValueError):
            return bytes.fromhex(api_key[len("e2b_") :]).decode("ascii")
    return api_key


class Control:
    """Each call is the router's own operation for the principal of `X-API-KEY`: the same
    checks, limits and ownership as `/v1`, called directly (no request is made up)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.router = gateway.router

    async def _principal(self, request: Request) -> Principal:
        key = sandcell_key(request.headers.get("x-api-key", ""))
        return await self.router.principal(request, key)

    async def _owned(self, request: Request, sandbox_id: str) -> SandboxRecord:
        return await self.router.sandbox_of(await self._principal(request), sandbox_id)

    async def create(self, request: Request) -> Response:
        principal = await self._principal(request)
        body = await json_body(request, MAX_BODY)
        template = _template(body.get("templateID"))
        create = {
            "template": template,
            "env": body.get("envVars") or {},
            "metadata": body.get("metadata") or {},
        }
        if (timeout := _timeout(body)) is not None:
            create["idle_timeout_s"] = timeout
        req = parse_model(schemas.CreateSandbox, json.dumps(create).encode())
        sandbox = schemas.sandbox_view(await self.router.create(principal, req))
        return JSONResponse(
            await _created(self.gateway, sandbox, body.get("templateID") or "base"), 201
        )

    def _view(self, record: SandboxRecord) -> dict[str, Any]:
        templates = self.router.manager.templates
        sandbox = schemas.sandbox_view(record)
        return _detail(sandbox, templates.get(sandbox["template"], Template()))

    async def describe(self, request: Request, sandbox_id: str) -> Response:
        return JSONResponse(self._view(await self._owned(request, sandbox_id)))

    async def list(self, request: Request) -> Response:
        principal = await self._principal(request)
        records = await self.router.store.list_sandboxes(
            None if principal.admin else principal.name
        )
        rows = [self._view(r) for r in records if r.state != "deleted"]
        return JSONResponse([r for r in rows if _matches(r, request)])

    async def kill(self, request: Request, sandbox_id: str) -> Response:
        await self.router.delete(await self._owned(request, sandbox_id))
        return Response(status_code=204)

    async def set_timeout(self, request: Request, sandbox_id: str) -> Response:
        record = await self._owned(request, sandbox_id)
        await self.router.keepalive(record, _timeout(await json_body(request, MAX_BODY)))
        return Response(status_code=204)

    async def connect(self, request: Request, sandbox_id: str) -> Response:
        record = await self._owned(request, sandbox_id)
        timeout = _timeout(await json_body(request, MAX_BODY))
        sandbox = schemas.sandbox_view(await self.router.keepalive(record, timeout))
        return JSONResponse(await _created(self.gateway, sandbox, sandbox["template"]), 200)

    async def metrics(self, request: Request, sandbox_id: str) -> Response:
        m = await metrics_of(self.router, await self._owned(request, sandbox_id))
        return JSONResponse(
            [
                {
                    "timestamp": m.at,
                    "timestampUnix": 0,
                    "cpuCount": int(m.cpus or 1),
                    "cpuUsedPct": float(m.cpu_percent or 0.0),
                    "memUsed": int(m.memory_bytes or 0),
                    "memTotal": int(m.memory_limit_bytes or 0),
                    "memCache": 0,
                    "diskUsed": int(m.disk_used_bytes or 0),
                    "diskTotal": int(m.disk_limit_bytes or 0),
                }
            ]
        )

    async def pause(self, request: Request, sandbox_id: str) -> Response:
        """sandcell keeps the files, never memory (SPEC §13), whatever E2B's `memory` asks;
        an already paused sandbox is E2B's 409, which its SDK reads as "already paused"."""
        record = await self._owned(request, sandbox_id)
        if record.state == "paused":
            raise SandcellError(ErrorCode.CONFLICT, f"sandbox {sandbox_id} is already paused")
        await persistence.pause_sandbox(self.router, record)
        return Response(status_code=204)

    async def resume(self, request: Request, sandbox_id: str) -> Response:
        record = await self._owned(request, sandbox_id)
        sandbox = schemas.sandbox_view(await persistence.resume_sandbox(self.router, record))
        return JSONResponse(await _created(self.gateway, sandbox, sandbox["template"]), 201)
