"""What the egress proxy needs to know of one sandbox's secrets: the contract between the
secrets room (which stores values and mints placeholders) and `network/tls` (which substitutes
them on the way out). Values live here only in the host's memory, never in a cell."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

Where = Literal["headers", "query", "body"]
Decision = Literal["substituted", "refused_host", "refused_plain_http", "refused_place", "deleted"]


@dataclass(frozen=True)
class SecretBinding:
    """One secret as one sandbox sees it."""

    name: str  # e.g. "OPENAI_API_KEY", also the environment variable's name
    placeholder: str  # `sandcell-secret-<name>-<random>`, unique to this sandbox
    value: bytes  # the real value: host memory only
    hosts: frozenset[str]  # canonical host names the value may be sent to
    where: frozenset[Where]  # headers always; query and body only by opt-in

    def __repr__(self) -> str:  # never the value, not even in a traceback
        return f"SecretBinding({self.name!r}, hosts={sorted(self.hosts)})"


# The sandbox's bindings now: looked up per connection, so a rotation or a deletion applies to
# the next connection of a live sandbox. The store's: `secrets.lookup.bindings_from_store(store)`
# (a deleted secret is absent; `hosts` are bare names: a secret's `host:port` entry is enforced
# by the sandbox's allow list, which the create joined it to).
BindingsLookup = Callable[[str], Awaitable[tuple[SecretBinding, ...]]]
# Every substitution and refusal: counted (`sandcell_secret_uses_total{secret,decision}`) and
# recorded for the audit trail (§20). The room's: `secrets.metrics.SecretUses()`, registered on
# the router's registry with `.register(router.metrics.registry)`.
UseRecorder = Callable[[str, str, str, Decision], None]  # sandbox id, secret, host, decision
