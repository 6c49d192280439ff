"""A sandbox created with secrets (SPEC §17): a placeholder per secret in its environment,
and the secrets' hosts joined to its egress allow list, within the template's cap.

Placeholders are not secret: they go into the cell's environment and the sandbox record, so
the proxy can tell after a router restart which sandbox may use which secret. The values stay
sealed in the owner's records until the proxy looks them up for a connection."""

from __future__ import annotations

import secrets as random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandcell.errors import ErrorCode, ServiceError
from sandcell.network.policy import MODES, Mode, parse_policy
from sandcell.secrets.shapes import host_name
from sandcell.store import SandboxRecord, Store, UserSecretRecord

PLACEHOLDER_PREFIX = "sandcell-secret-"
_RANDOM_BYTES = 16  # 128 bits: a placeholder cannot be guessed from another sandbox's


def new_placeholder(name: str) -> str:
    """`sandcell-secret-<name>-<random>`: hex only, so it passes unchanged through headers,
    query strings and bodies."""
    return f"{PLACEHOLDER_PREFIX}{name}-{random.token_hex(_RANDOM_BYTES)}"


@dataclass(frozen=True)
class Grant:
    """What a create gets from its secrets: env additions, the network policy, and the
    name -> placeholder map to keep in the sandbox record."""

    env: dict[str, str] = field(default_factory=dict)
    network: dict[str, Any] | None = None
    placeholders: dict[str, str] = field(default_factory=dict)


async def grant(
    store: Store,
    owner: str,
    names: Sequence[str],
    *,
    env: Mapping[str, str],
    network: Mapping[str, Any] | None,
    default_network: Mapping[str, Any],
    network_max: Mode,
) -> Grant:
    """The grant of `names` (the owner's secrets) to a new sandbox whose request asked for
    `env` and `network` (None: the template's `default_network`). Unknown names are 404, a
    name also set in `env` or a host the policy denies is 400, and hosts beyond the cap 403,
    each naming the secret."""
    records = [await _owned(store, owner, name) for name in names]
    for rec in records:
        if rec.name in env:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"env sets {rec.name}, which is the name of a secret this sandbox is given",
                {"field": "env", "secret": rec.name},
            )
    policy = _widened(records, network, default_network, network_max)
    placeholders = {rec.name: new_placeholder(rec.name) for rec in records}
    return Grant(env=dict(placeholders), network=policy, placeholders=placeholders)


async def regrant(store: Store, parent: SandboxRecord) -> tuple[dict[str, str], dict[str, str]]:
    """A fork's env and placeholders: its parent's secrets that still exist, each with a
    placeholder of its own (a placeholder is never shared by two sandboxes); the variable of
    a secret deleted since is left out. The parent's policy allows the hosts already."""
    env = {k: v for k, v in parent.env.items() if k not in parent.secrets}
    placeholders = {
        name: new_placeholder(name)
        for name in sorted(parent.secrets)
        if await store.get_user_secret(parent.owner, name) is not None
    }
    return {**env, **placeholders}, placeholders


async def _owned(store: Store, owner: str, name: str) -> UserSecretRecord:
    rec = await store.get_user_secret(owner, name)
    if rec is None:
        raise ServiceError(
            ErrorCode.NOT_FOUND,
            f"secret {name} not found",
            {"field": "secrets", "secret": name},
        )
    return rec


def _widened(
    records: Sequence[UserSecretRecord],
    requested: Mapping[str, Any] | None,
    default: Mapping[str, Any],
    network_max: Mode,
) -> dict[str, Any]:
    """The policy with every secret's hosts allowed: an `egress: none` default becomes an
    allow list, an explicit `none` is refused (it cannot take effect beside a secret)."""
    base = dict(requested if requested is not None else default)
    parsed = parse_policy(base)  # 400 naming a malformed entry
    if requested is not None and requested.get("egress") == "none":
        raise ServiceError(
            ErrorCode.BAD_REQUEST,
            f"network egress 'none' leaves secret {records[0].name} no host to reach",
            {"field": "network.egress", "secret": records[0].name},
        )
    egress: Mode = "allowlist" if parsed.egress == "none" else parsed.egress
    if MODES.index(egress) > MODES.index(network_max):
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"secret {records[0].name} needs egress to {records[0].hosts[0]}, beyond this "
            f"template's network_max ({network_max!r})",
            {"secret": records[0].name, "network_max": network_max},
        )
    allow = list(base.get("allow", []))
    for rec in records:
        for host in rec.hosts:
            denied = next((e for e in parsed.deny if e.matches_name(host_name(host))), None)
            if denied is not None:
                raise ServiceError(
                    ErrorCode.BAD_REQUEST,
                    f"secret {rec.name} names {host}, which deny entry {denied.text!r} refuses",
                    {"field": "network.deny", "secret": rec.name, "entry": denied.text},
                )
            if host not in allow:
                allow.append(host)
    return {"egress": egress, "allow": allow, "deny": list(base.get("deny", []))}
