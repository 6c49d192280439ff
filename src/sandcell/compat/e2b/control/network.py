"""E2B's egress options as sandcell's policy (SPEC §11): read at create, capped by the
template's `network_max`, and replaced whole by `PUT /sandboxes/{id}/network`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sandcell.compat.e2b.bodies import json_body
from sandcell.compat.e2b.control.common import MAX_BODY, _owned, _refused
from sandcell.compat.e2b.control.secrets import RULES_REFUSAL
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.templates import Template
from sandcell.router.auth import Principal

ALL_TRAFFIC = frozenset({"0.0.0.0/0", "::/0"})

NETWORK_FIELDS = frozenset({"allowOut", "denyOut", "allowPublicTraffic", "allow_internet_access"})


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
            RULES_REFUSAL
            if field == "rules"
            else "sandcell's egress proxies do not offer it (SPEC §11: allow and deny lists only)",
        )
    public = net.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise _refused(f"{where}network.allowPublicTraffic", "must be a boolean")
    # Either value is taken: E2B's default `true` (which e2b 2.45's model sends with every
    # `network`) and `false` both give sandcell's exposed ports, reached with the API key or
    # a signed preview URL only. `true` opens nothing wider: anyone holding the URL gets in,
    # as on E2B, but sandcell's URL carries its token.
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
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"{where}network asks for egress {policy['egress']!r} (E2B lets out what denyOut "
            f"does not name unless denyOut holds 0.0.0.0/0), wider than template {name!r} "
            f"allows: its network_max is {template.network_max!r}; an operator allows it "
            f'with network_max = "{policy["egress"]}" in [templates.{name}]',
            {"field": "network", "setting": "network_max", "limit": template.network_max},
        )


async def update_network(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """E2B's update replaces the whole egress configuration: what it leaves out is the
    template's default again, as a create without those fields."""
    record = await _owned(gateway, principal, request)
    body = await json_body(request, MAX_BODY)
    if not isinstance(body, dict):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    template = gateway.router.manager.template(record.template)
    policy = _network({"network": body}, "")
    _within_max(template, record.template, policy, "")
    await gateway.router.manager.set_network(record, policy)
    return Response(status_code=204)
