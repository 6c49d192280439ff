"""E2B's control API (`E2B_API_URL`): sandboxes created, listed, killed and kept alive by
sandcell's own router handlers, run in-process with the caller's key (`X-API-KEY`)."""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b import tokens
from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.gateway import Gateway
from sandcell.compat.inprocess import read_json
from sandcell.errors import ErrorCode, SandcellError
from sandcell.manager.templates import Template
from sandcell.router import app as router_app
from sandcell.router import persistence
from sandcell.router.usage import sandbox_metrics

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
    token = await tokens.mint(gateway.router.store, sandbox["id"])
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
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _call(
        self,
        outer: Request,
        handler: Any,
        method: str,
        path: str,
        body: Any = None,
        sandbox_id: str | None = None,
    ) -> Response:
        params = {"sandbox_id": sandbox_id} if sandbox_id else None
        data = b"" if body is None else json.dumps(body).encode()
        key = sandcell_key(outer.headers.get("x-api-key", ""))
        client = outer.client.host if outer.client else "unknown"
        return await self.gateway.control(
            handler, key, client, method, path, body=data, path_params=params
        )

    async def create(self, request: Request) -> Response:
        body = await json_body(request, MAX_BODY)
        template = _template(body.get("templateID"))
        create = {
            "template": template,
            "env": body.get("envVars") or {},
            "metadata": body.get("metadata") or {},
        }
        if (timeout := _timeout(body)) is not None:
            create["idle_timeout_s"] = timeout
        response = await self._call(
            request, router_app.create_sandbox, "POST", "/v1/sandboxes", create
        )
        sandbox = await read_json(response)
        return JSONResponse(
            await _created(self.gateway, sandbox, body.get("templateID") or "base"), 201
        )

    async def get(self, request: Request, sandbox_id: str) -> dict[str, Any]:
        path = f"/v1/sandboxes/{sandbox_id}"
        response = await self._call(
            request, router_app.get_sandbox, "GET", path, sandbox_id=sandbox_id
        )
        return await read_json(response)

    def _view(self, sandbox: dict[str, Any]) -> dict[str, Any]:
        templates = self.gateway.router.manager.templates
        return _detail(sandbox, templates.get(sandbox["template"], Template()))

    async def describe(self, request: Request, sandbox_id: str) -> Response:
        return JSONResponse(self._view(await self.get(request, sandbox_id)))

    async def list(self, request: Request) -> Response:
        response = await self._call(request, router_app.list_sandboxes, "GET", "/v1/sandboxes")
        listed = await read_json(response)
        rows = [self._view(s) for s in listed["sandboxes"]]
        return JSONResponse([r for r in rows if _matches(r, request)])

    async def kill(self, request: Request, sandbox_id: str) -> Response:
        path = f"/v1/sandboxes/{sandbox_id}"
        await self._call(request, router_app.delete_sandbox, "DELETE", path, sandbox_id=sandbox_id)
        return Response(status_code=204)

    async def set_timeout(self, request: Request, sandbox_id: str) -> Response:
        body = {"idle_timeout_s": _timeout(await json_body(request, MAX_BODY))}
        path = f"/v1/sandboxes/{sandbox_id}/keepalive"
        await self._call(request, router_app.keepalive, "POST", path, body, sandbox_id)
        return Response(status_code=204)

    async def connect(self, request: Request, sandbox_id: str) -> Response:
        body = {"idle_timeout_s": _timeout(await json_body(request, MAX_BODY))}
        path = f"/v1/sandboxes/{sandbox_id}/keepalive"
        await self._call(request, router_app.keepalive, "POST", path, body, sandbox_id)
        sandbox = await self.get(request, sandbox_id)
        return JSONResponse(await _created(self.gateway, sandbox, sandbox["template"]), 200)

    async def metrics(self, request: Request, sandbox_id: str) -> Response:
        path = f"/v1/sandboxes/{sandbox_id}/metrics"
        response = await self._call(request, sandbox_metrics, "GET", path, sandbox_id=sandbox_id)
        m = await read_json(response)
        return JSONResponse(
            [
                {
                    "timestamp": m["at"],
                    "timestampUnix": 0,
                    "cpuCount": int(m.get("cpus") or 1),
                    "cpuUsedPct": float(m.get("cpu_percent") or 0.0),
                    "memUsed": int(m.get("memory_bytes") or 0),
                    "memTotal": int(m.get("memory_limit_bytes") or 0),
                    "memCache": 0,
                    "diskUsed": int(m.get("disk_used_bytes") or 0),
                    "diskTotal": int(m.get("disk_limit_bytes") or 0),
                }
            ]
        )

    async def pause(self, request: Request, sandbox_id: str) -> Response:
        """sandcell keeps the files, never memory (SPEC §13), whatever E2B's `memory` asks;
        an already paused sandbox is E2B's 409, which its SDK reads as "already paused"."""
        if (await self.get(request, sandbox_id))["state"] == "paused":
            raise SandcellError(ErrorCode.CONFLICT, f"sandbox {sandbox_id} is already paused")
        path = f"/v1/sandboxes/{sandbox_id}/pause"
        await self._call(request, persistence.pause, "POST", path, sandbox_id=sandbox_id)
        return Response(status_code=204)

    async def resume(self, request: Request, sandbox_id: str) -> Response:
        path = f"/v1/sandboxes/{sandbox_id}/resume"
        response = await self._call(
            request, persistence.resume, "POST", path, sandbox_id=sandbox_id
        )
        sandbox = await read_json(response)
        return JSONResponse(await _created(self.gateway, sandbox, sandbox["template"]), 201)
