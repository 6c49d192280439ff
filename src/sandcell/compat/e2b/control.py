"""E2B's control API (`E2B_API_URL`): sandboxes created, listed, killed and kept alive by
the router's own operations, for the principal of the caller's key (`X-API-KEY`).

Each call is the router's own operation for that principal: the same checks, limits and
ownership as `/v1`, called directly (no request is made up). The routes are a table
(`OPERATIONS`), each handler wrapped once by `_secured`: the key is checked before any
handler runs, and every error leaves in E2B's REST shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, unquote

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b import errors
from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import STATUS, ErrorCode, SandcellError
from sandcell.http.bodies import parse_model
from sandcell.http.openapi import Endpoint, Operation, Query
from sandcell.manager.manager import within_lifetime
from sandcell.manager.templates import Template
from sandcell.router import persistence, schemas
from sandcell.router.auth import Principal
from sandcell.router.usage import metrics_of
from sandcell.store import SandboxRecord, SnapshotRecord

if TYPE_CHECKING:
    from sandcell.router.core import Router

log = logging.getLogger(__name__)

ENVD_VERSION = "0.6.3"
CLIENT_ID = "sandcell"
TEMPLATES = {"base": "default", "code-interpreter-v1": "code-interpreter"}
MAX_BODY = 1_048_576
HEX_KEY = re.compile(r"\Ae2b_(?:[0-9a-f]{2})+\Z")
MAX_TIMEOUT_S = 604_800  # as /v1's idle_timeout_s
DEFAULT_TIMEOUT_S = 300  # E2B's, when connect names none
SNAPSHOT = re.compile(schemas.SNAPSHOT_ID)
MAX_PAGE = 100  # E2B's default and largest page
MAX_FORKS = 20  # E2B's bound on count
SAMPLE_EVERY_S = 5.0  # metrics sampling of the sandboxes /e2b has seen
KEEP_SAMPLES = 720  # per sandbox: an hour at SAMPLE_EVERY_S
SECURITY = ("e2bApiKey",)
SCHEME = {
    "type": "apiKey",
    "in": "header",
    "name": "X-API-KEY",
    "description": "a sandcell API key, as given or hex-encoded behind `e2b_`",
}
Row = TypeVar("Row")
Handler = Callable[[Gateway, Principal, Request], Awaitable[Response]]


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
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TIMEOUT_S:
        raise SandcellError(
            ErrorCode.BAD_REQUEST, f"timeout must be an integer from 1 to {MAX_TIMEOUT_S}"
        )
    return value


# -- create's fields (SPEC §14.2: each takes effect or is refused by name) -------------------

ALL_TRAFFIC = frozenset({"0.0.0.0/0", "::/0"})
# Read by create, or harmless: `secure` asks for envd's access token, which sandcell always
# requires; `mcp: null`, `iam` without tokens and `volumeMounts: []` ask for nothing.
CREATE_FIELDS = frozenset(
    {"templateID", "timeout", "envVars", "metadata", "autoPause", "autoPauseMemory"}
    | {"autoResume", "allow_internet_access", "network", "secure", "mcp", "iam", "volumeMounts"}
)
NETWORK_FIELDS = frozenset({"allowOut", "denyOut", "allowPublicTraffic", "allow_internet_access"})


def _refused(field: str, why: str) -> SandcellError:
    return SandcellError(ErrorCode.BAD_REQUEST, f"{field}: {why}", {"field": field})


def _strings(field: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _refused(field, "must be a list of strings")
    return list(value)


def _network(body: dict[str, Any], where: str) -> dict[str, Any] | None:
    """E2B's egress options as a sandcell policy (SPEC §11), None for the template's default.

    E2B lets everything out unless `denyOut` holds all traffic (`0.0.0.0/0`), and an
    `allowOut` entry then lets its address through: that is sandcell's `allowlist`; a
    `denyOut` of some addresses only is `open` with those denied; `allow_internet_access:
    false` denies all traffic. E2B's default (internet on) is the template's own policy."""
    net = body.get("network")
    if net is None:
        net = {}
    if not isinstance(net, dict):
        raise _refused(f"{where}network", "must be an object")
    for field, value in net.items():
        if field in NETWORK_FIELDS or value in (None, [], {}, ""):
            continue
        raise _refused(
            f"{where}network.{field}",
            "sandcell's egress proxies do not offer it (SPEC §11: allow and deny lists only)",
        )
    if net.get("allowPublicTraffic") is True:
        raise _refused(
            f"{where}network.allowPublicTraffic",
            "sandcell's exposed ports always need the API key or a signed preview URL",
        )
    allow = _strings(f"{where}network.allowOut", net.get("allowOut"))
    deny = _strings(f"{where}network.denyOut", net.get("denyOut"))
    internet = body.get("allow_internet_access", net.get("allow_internet_access"))
    if internet is not None and not isinstance(internet, bool):
        raise _refused(f"{where}allow_internet_access", "must be a boolean")
    if internet is False:
        deny.append("0.0.0.0/0")
    if not allow and not deny:
        return None
    rest = [d for d in deny if d not in ALL_TRAFFIC]
    if len(rest) < len(deny):
        return {"egress": "allowlist" if allow else "none", "allow": allow, "deny": rest}
    return {"egress": "open", "allow": allow, "deny": rest}


def _within_max(template: Template, name: str, policy: dict[str, Any] | None, where: str) -> None:
    """A policy wider than the template's `network_max` is refused naming the E2B fields and
    the setting that allows it (the manager's own cap check follows for the entries)."""
    if policy is None:
        return
    modes = ("none", "allowlist", "open")
    if modes.index(policy["egress"]) > modes.index(template.network_max):
        raise SandcellError(
            ErrorCode.FORBIDDEN,
            f"{where}network asks for egress {policy['egress']!r} (E2B lets out what denyOut "
            f"does not name unless denyOut holds 0.0.0.0/0), wider than template {name!r} "
            f"allows: its network_max is {template.network_max!r}; an operator allows it "
            f'with network_max = "{policy["egress"]}" in [templates.{name}]',
            {"field": "network", "setting": "network_max", "limit": template.network_max},
        )


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


def _harmless(body: dict[str, Any]) -> None:
    for field in sorted(set(body) - CREATE_FIELDS):
        raise _refused(field, "sandcell does not know this field of E2B's create")
    if body.get("mcp") not in (None, {}):
        raise _refused("mcp", "sandcell runs no MCP gateway inside sandboxes")
    iam = body.get("iam")
    if iam not in (None, {}) and (not isinstance(iam, dict) or iam.get("tokens")):
        raise _refused("iam", "sandcell has no workload identity tokens (see SPEC §17 secrets)")
    if body.get("volumeMounts") not in (None, []):
        raise _refused("volumeMounts", "sandcell has no volumes; snapshots keep files (§13)")
    if body.get("secure") not in (None, True, False):
        raise _refused("secure", "must be a boolean")


def _instant(field: str, text: str) -> float:
    """An RFC 3339 time of a query (a `+` of its offset may arrive as a space)."""
    try:
        when = datetime.fromisoformat(text.strip().replace(" ", "+").replace("Z", "+00:00"))
    except ValueError:
        raise _refused(field, "must be an RFC 3339 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _filter(rows: list[dict[str, Any]], request: Request) -> list[dict[str, Any]]:
    """E2B's list query: `metadata` (an urlencoded `k=v&...` string), `state`, `template`
    (E2B's name or sandcell's), `startedAfter`, and `order` by start (asc by default)."""
    query = request.query_params
    # The SDK quotes each key and value, then urlencodes the lot: two decodings.
    wanted = [(unquote(k), unquote(v)) for k, v in parse_qsl(query.get("metadata", ""))]
    rows = [r for r in rows if all(r["metadata"].get(k) == v for k, v in wanted)]
    if states := query.get("state"):
        rows = [r for r in rows if r["state"] in states.split(",")]
    if template := query.get("template"):
        rows = [r for r in rows if r["templateID"] in (template, _template(template))]
    if after := query.get("startedAfter"):
        since = _instant("startedAfter", after)
        rows = [r for r in rows if _instant("startedAt", r["startedAt"]) > since]
    order = query.get("order", "asc")
    if order not in ("asc", "desc"):
        raise _refused("order", "must be asc or desc")
    rows.sort(key=_sandbox_key, reverse=order == "desc")
    return rows


def _sandbox_key(row: dict[str, Any]) -> str:
    return f"{_instant('startedAt', row['startedAt']):017.6f}/{row['sandboxID']}"


def sandcell_key(api_key: str) -> str:
    """The sandcell key in an `X-API-KEY`: as given, or hex-encoded behind `e2b_`, the only
    form some e2b versions (2.2x-2.3x) let through their own format check."""
    if HEX_KEY.match(api_key):
        with contextlib.suppress(ValueError):
            return bytes.fromhex(api_key[len("e2b_") :]).decode("ascii")
    return api_key


def _secured(name: str, handler: Handler) -> Endpoint:
    """`handler` for the principal of the call's `X-API-KEY`, checked before it runs (so no
    control operation can forget it), its errors in E2B's REST shape."""

    async def endpoint(request: Request) -> Response:
        try:
            gateway = Gateway.of(request)
            key = sandcell_key(request.headers.get("x-api-key", ""))
            principal = await gateway.router.principal(request, key)
            return await handler(gateway, principal, request)
        except SandcellError as exc:
            return errors.rest_error(exc)

    endpoint.__name__ = endpoint.__qualname__ = f"e2b_{name}"
    return endpoint


async def _owned(gateway: Gateway, principal: Principal, request: Request) -> SandboxRecord:
    return await gateway.router.sandbox_of(principal, request.path_params["sandbox_id"])


def _view(gateway: Gateway, record: SandboxRecord) -> dict[str, Any]:
    templates = gateway.router.manager.templates
    sandbox = schemas.sandbox_view(record)
    return _detail(sandbox, templates.get(sandbox["template"], Template()))


async def create(gateway: Gateway, principal: Principal, request: Request) -> Response:
    body = await json_body(request, MAX_BODY)
    if not isinstance(body, dict):
        raise SandcellError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    _harmless(body)
    template = _template(body.get("templateID"))
    snapshot = None
    if SNAPSHOT.match(template):  # E2B starts a sandbox from a snapshot by its id
        snapshot = await gateway.router.manager.snapshots.owned(
            None if principal.admin else principal.name, template
        )
        template = snapshot.template
    create: dict[str, Any] = {
        "template": template,
        **({"snapshot": snapshot.id} if snapshot else {}),
        "env": body.get("envVars") or {},
        "metadata": body.get("metadata") or {},
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
    page, headers = _page(request, rows, _sandbox_key)
    return JSONResponse(page, headers=headers)


async def kill(gateway: Gateway, principal: Principal, request: Request) -> Response:
    await gateway.router.delete(await _owned(gateway, principal, request))
    return Response(status_code=204)


async def set_timeout(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """E2B's timeout is a deadline: the sandbox ends `timeout` from now, sooner or later."""
    record = await _owned(gateway, principal, request)
    timeout = _timeout(await json_body(request, MAX_BODY))
    if timeout is None:
        raise _refused("timeout", "is required")
    await gateway.router.set_end(record, timeout)
    return Response(status_code=204)


async def connect(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """As E2B: a running sandbox's end moves to `timeout` from now if that is later (E2B's
    default timeout, 300 s, when none is given); a paused one resumes with that end."""
    record = await _owned(gateway, principal, request)
    timeout = _timeout(await json_body(request, MAX_BODY)) or DEFAULT_TIMEOUT_S
    was_running = record.state == "running"
    if record.state == "paused":  # connecting resumes it, auto_resume or not (as E2B)
        record = await persistence.resume_sandbox(gateway.router, record)
    ended = await gateway.router.set_end(record, timeout, extend_only=was_running)
    Samples.of(gateway.router).watch(record.id)
    sandbox = schemas.sandbox_view(ended)
    return JSONResponse(await _created(gateway, sandbox, sandbox["template"]), 200)


class Samples:
    """Per-sandbox rings of E2B metrics samples, kept in this router process (sandcell's
    backend reads a cell's use when asked and keeps no history): a sandbox made, connected
    to or asked about through /e2b is sampled every SAMPLE_EVERY_S and on each metrics call,
    its last KEEP_SAMPLES (an hour) kept, and forgotten when it is deleted. A router that
    restarts starts afresh; another router of a fleet keeps its own."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.rings: dict[str, deque[dict[str, Any]]] = {}
        self.task: asyncio.Task[None] | None = None
        router.on_delete.append(self.forget)

    @classmethod
    def of(cls, router: Router) -> Samples:
        if (samples := _SAMPLES.get(router)) is None:
            samples = _SAMPLES[router] = cls(router)
        return samples

    async def forget(self, sandbox_id: str) -> None:
        self.rings.pop(sandbox_id, None)

    def watch(self, sandbox_id: str) -> deque[dict[str, Any]]:
        ring = self.rings.setdefault(sandbox_id, deque(maxlen=KEEP_SAMPLES))
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())
        return ring

    async def sample(self, record: SandboxRecord) -> None:
        ring = self.watch(record.id)
        if record.state != "running" or (ring and time.time() - ring[-1]["_at"] < 1):
            return
        with contextlib.suppress(SandcellError):  # gone or paused meanwhile: no sample
            m = await metrics_of(self.router, record)
            now = time.time()
            ring.append(
                {
                    "_at": now,
                    "timestamp": m.at,
                    "timestampUnix": int(now),
                    "cpuCount": max(1, math.ceil(m.cpus or 1)),
                    "cpuUsedPct": float(m.cpu_percent or 0.0),
                    "memUsed": int(m.memory_bytes or 0),
                    "memTotal": int(m.memory_limit_bytes or 0),
                    "memCache": 0,
                    "diskUsed": int(m.disk_used_bytes or 0),
                    "diskTotal": int(m.disk_limit_bytes or 0),
                }
            )

    async def _run(self) -> None:
        while self.rings:
            await asyncio.sleep(SAMPLE_EVERY_S)
            for sandbox_id in list(self.rings):
                try:
                    record = await self.router.store.get_sandbox(sandbox_id)
                except Exception:  # a store hiccup: try again next round
                    log.warning("metrics sampling: the store failed", exc_info=True)
                    break
                if record is None or record.state == "deleted":
                    self.rings.pop(sandbox_id, None)
                else:
                    await self.sample(record)


_SAMPLES: weakref.WeakKeyDictionary[Router, Samples] = weakref.WeakKeyDictionary()


def _bound(request: Request, field: str) -> float | None:
    raw = request.query_params.get(field)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise _refused(field, "must be a Unix time in seconds") from None


async def metrics(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """The samples from `start` to `end` (Unix seconds, both inclusive; either open), a
    fresh one taken first when the sandbox runs."""
    record = await _owned(gateway, principal, request)
    start, end = _bound(request, "start"), _bound(request, "end")
    samples = Samples.of(gateway.router)
    await samples.sample(record)
    rows = [
        {k: v for k, v in row.items() if k != "_at"}
        for row in samples.watch(record.id)
        if (start is None or row["_at"] >= start) and (end is None or row["_at"] < end + 1)
    ]
    return JSONResponse(rows)


async def update_network(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """E2B's update replaces the whole egress configuration: what it leaves out is the
    template's default again, as a create without those fields."""
    record = await _owned(gateway, principal, request)
    body = await json_body(request, MAX_BODY)
    if not isinstance(body, dict):
        raise SandcellError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    template = gateway.router.manager.template(record.template)
    policy = _network({"network": body}, "")
    _within_max(template, record.template, policy, "")
    await gateway.router.manager.set_network(record, policy)
    return Response(status_code=204)


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
        raise SandcellError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    _files_only(body)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 128):
        raise _refused("name", "must be a string of at most 128 characters")
    snapshot = await gateway.router.manager.snapshots.take(principal.name, record.id, name)
    return JSONResponse(_snapshot_info(snapshot), 201)


def _limit(request: Request, most: int) -> int | None:
    raw = request.query_params.get("limit")
    if raw is None:
        return None  # E2B's first API (GET /sandboxes) has no pages: all of them
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise _refused("limit", f"must be an integer from 1 to {most}")
    return int(raw)


def _page(request: Request, rows: list[Row], key: Callable[[Row], str]) -> tuple[list[Row], dict]:
    """E2B's pagination over `rows` sorted by `key` (ascending, or descending with `order=
    desc`): `limit` rows after the `nextToken` (the last row's key), and `X-Next-Token` when
    more follow. A key orders, so a row deleted between pages loses no other."""
    limit = _limit(request, MAX_PAGE)
    if after := request.query_params.get("nextToken"):
        desc = request.query_params.get("order") == "desc"
        rows = [r for r in rows if (key(r) < after if desc else key(r) > after)]
    page = rows if limit is None else rows[:limit]
    return page, ({"X-Next-Token": key(page[-1])} if len(rows) > len(page) else {})


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
        raise SandcellError(
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
        raise SandcellError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
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
                child = await router.manager.create_sandbox(
                    parent.owner,
                    parent.template,
                    idle_timeout_s=timeout or parent.idle_timeout_s,
                    max_lifetime_s=timeout,
                    env=parent.env,
                    metadata=parent.metadata,
                    network=parent.network or None,
                    reservation=reservation,
                    auto_resume=parent.auto_resume,
                    on_timeout=parent.on_timeout,
                    snapshot=snapshot,
                    resources=parent.resources,
                )
                view = schemas.sandbox_view(child)
                Samples.of(router).watch(child.id)
                results.append({"sandbox": await _created(gateway, view, parent.template)})
            except SandcellError as exc:
                results.append(
                    {"error": {"code": STATUS.get(exc.code, 500), "message": exc.message}}
                )
    finally:
        await router.manager.snapshots.delete(snapshot)
    return JSONResponse(results, 201)


async def pause(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """sandcell keeps the files, never memory (SPEC §13), whatever E2B's `memory` asks;
    an already paused sandbox is E2B's 409, which its SDK reads as "already paused". So the
    key's bound on paused sandboxes, also a 409 on /v1, is E2B's 429 here: its SDK raises it
    (`RateLimitException`, naming the bound) instead of reporting an ordinary "already"."""
    record = await _owned(gateway, principal, request)
    if record.state == "paused":
        raise SandcellError(ErrorCode.CONFLICT, f"sandbox {record.id} is already paused")
    try:
        await persistence.pause_sandbox(gateway.router, record)
    except SandcellError as exc:
        if exc.code is not ErrorCode.CONFLICT or "max_paused_per_key" not in exc.details:
            raise
        raise SandcellError(ErrorCode.RATE_LIMITED, exc.message, exc.details) from None
    return Response(status_code=204)


async def resume(gateway: Gateway, principal: Principal, request: Request) -> Response:
    record = await _owned(gateway, principal, request)
    sandbox = schemas.sandbox_view(await persistence.resume_sandbox(gateway.router, record))
    return JSONResponse(await _created(gateway, sandbox, sandbox["template"]), 201)


# -- the table -------------------------------------------------------------------------------


class NewSandbox(BaseModel):
    """The fields of E2B's NewSandbox that sandcell reads (the rest is E2B's own)."""

    model_config = ConfigDict(extra="allow")
    templateID: str | None = None
    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S)
    envVars: dict[str, str] | None = None
    metadata: dict[str, str] | None = None
    autoPause: bool | None = None
    autoPauseMemory: bool | None = None
    autoResume: dict[str, bool] | None = None
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    secure: bool | None = None


class NetworkUpdate(BaseModel):
    """E2B's SandboxNetworkUpdateConfig (allowOut, denyOut, allow_internet_access)."""

    model_config = ConfigDict(extra="allow")
    allowOut: list[str] | None = None
    denyOut: list[str] | None = None
    allow_internet_access: bool | None = None


class Timeout(BaseModel):
    model_config = ConfigDict(extra="allow")
    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S)


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    memory: bool | None = None


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S)
    count: int | None = Field(None, ge=1, le=MAX_FORKS)


class Created(BaseModel):
    """E2B's Sandbox: what create, connect and resume answer."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    envdAccessToken: str
    trafficAccessToken: str
    domain: str | None


_SBX = "/sandboxes/{sandbox_id}"
_LIST_QUERY = (
    Query("metadata", {"type": "string"}, description="urlencoded k=v pairs"),
    Query("state", {"type": "string"}, description="running,paused"),
    Query("template", {"type": "string"}),
    Query("startedAfter", {"type": "string"}, description="RFC 3339"),
    Query("order", {"type": "string"}, description="asc (default) or desc, by start"),
    Query("limit", {"type": "integer"}, description=f"at most {MAX_PAGE}; absent: all"),
    Query("nextToken", {"type": "string"}, description="from X-Next-Token"),
)
_METRICS_QUERY = (
    Query("start", {"type": "integer"}, description="Unix seconds"),
    Query("end", {"type": "integer"}, description="Unix seconds"),
)


_SNAP_QUERY = (
    Query("sandboxID", {"type": "string"}, description="snapshots of this sandbox"),
    Query("name", {"type": "string"}),
    Query("limit", {"type": "integer"}, description=f"at most {MAX_PAGE}"),
    Query("nextToken", {"type": "string"}, description="from X-Next-Token"),
)


def _op(method: str, path: str, handler: Handler, summary: str, **kw: Any) -> Operation:
    name = (path.strip("/").split("/")[0] + "_" if path.startswith("/v2/") else "") + (
        handler.__name__
    )
    errors_ = tuple(sorted({401, 404, 429, *kw.pop("errors", ())}))
    return Operation(
        method,
        path,
        _secured(name, handler),
        f"E2B control: {summary}",
        errors=errors_,
        security=SECURITY,
        error_body=errors.RestError,
        **kw,
    )


OPERATIONS = (
    *(
        _op(
            "POST",
            f"{v}/sandboxes",
            create,
            "create a sandbox",
            body=NewSandbox,
            response=Created,
            status=201,
            errors=(403, 409, 413, 503),
        )
        for v in ("", "/v2")
    ),
    *(
        _op("GET", f"{v}/sandboxes", list_sandboxes, "list your sandboxes", query=_LIST_QUERY)
        for v in ("", "/v2")
    ),
    _op("GET", _SBX, describe, "describe a sandbox"),
    _op("DELETE", _SBX, kill, "kill a sandbox", status=204),
    _op("POST", f"{_SBX}/timeout", set_timeout, "set the timeout", body=Timeout, status=204),
    *(
        _op(
            "POST",
            f"{v}{_SBX}/connect",
            connect,
            "connect (a paused sandbox resumes; the timeout extends)",
            body=Timeout,
            response=Created,
            errors=(409,),
        )
        for v in ("", "/v2")
    ),
    _op(
        "GET",
        f"{_SBX}/metrics",
        metrics,
        "the metrics samples of a range",
        query=_METRICS_QUERY,
        errors=(400, 501),
    ),
    _op(
        "PUT",
        f"{_SBX}/network",
        update_network,
        "replace the egress policy (SPEC §11)",
        body=NetworkUpdate,
        status=204,
        errors=(400, 403),
    ),
    _op(
        "POST",
        f"{_SBX}/snapshots",
        create_snapshot,
        "snapshot the files (SPEC §13)",
        body=SnapshotRequest,
        status=201,
        errors=(400, 409, 413, 501),
    ),
    _op("GET", "/snapshots", list_snapshots, "list your snapshots", query=_SNAP_QUERY),
    _op(
        "DELETE",
        "/templates/{template_id}",
        delete_snapshot,
        "delete a snapshot (E2B's snapshots are templates)",
        status=204,
    ),
    _op(
        "POST",
        f"{_SBX}/fork",
        fork,
        "fork: one snapshot, count sandboxes from it",
        body=ForkRequest,
        status=201,
        errors=(400, 409, 501),
    ),
    _op("POST", f"{_SBX}/pause", pause, "pause (files kept)", status=204, errors=(409,)),
    _op(
        "POST",
        f"{_SBX}/resume",
        resume,
        "resume a paused sandbox",
        response=Created,
        status=201,
        errors=(409,),
    ),
)
