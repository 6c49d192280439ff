"""What the egress proxy needs to substitute secrets: the sandbox's bindings (looked up per
connection, so a rotation or a deletion applies to the next one), where decisions go, the
sandboxes' CAs and the upstream TLS context. Deleted secrets are remembered by name and
placeholder only (never their values), so their placeholders keep being refused."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field

from sandcell.network.tls.authority import Authorities
from sandcell.network.tls.relays import Relays
from sandcell.network.tls.rewrite import SHAPE, Gone, HostRules, Refusal
from sandcell.secrets.bindings import BindingsLookup, Decision, SecretBinding, UseRecorder

log = logging.getLogger("sandcell.egress.secrets")


@dataclass
class Substitution:
    bindings_for: BindingsLookup
    record_use: UseRecorder
    authorities: Authorities
    upstream: ssl.SSLContext
    relays: Relays = field(default_factory=Relays)  # the threads of intercepted connections
    _seen: dict[str, dict[str, Gone]] = field(default_factory=dict, repr=False)

    async def rules_for(self, sandbox_id: str, host: str, port: int) -> HostRules:
        bindings = await self.bindings_for(sandbox_id)
        return HostRules.of(bindings, host, port, self._gone(sandbox_id, bindings))

    def _gone(self, sandbox_id: str, bindings: tuple[SecretBinding, ...]) -> list[Gone]:
        seen = self._seen.setdefault(sandbox_id, {})
        for b in bindings:
            seen[b.placeholder] = Gone(b.name, b.placeholder, b.hosts)
        current = {b.placeholder for b in bindings}
        return [gone for placeholder, gone in seen.items() if placeholder not in current]

    def record(self, sandbox_id: str, secret: str, host: str, decision: Decision) -> None:
        log.info(
            "egress sandbox=%s secret=%s host=%s decision=%s", sandbox_id, secret, host, decision
        )
        try:
            self.record_use(sandbox_id, secret, host, decision)
        except Exception:
            log.exception("egress sandbox=%s: recording a secret's use failed", sandbox_id)

    async def plain_refusal(self, sandbox_id: str, host: str, head: bytes) -> Refusal | None:
        """A plain-HTTP request whose head carries a placeholder: never substituted (SPEC
        §17: TLS only), refused. Recorded; None when it carries none."""
        bindings = await self.bindings_for(sandbox_id)
        named = {b.placeholder.encode(): b.name for b in bindings}
        for gone in self._gone(sandbox_id, bindings):
            named.setdefault(gone.placeholder.encode(), gone.name)
        secret = next((name for p, name in named.items() if p in head), None)
        if secret is None and (match := SHAPE.search(head)):
            secret = match.group(1).decode()
        if secret is None:
            return None
        self.record(sandbox_id, secret, host, "refused_plain_http")
        return Refusal(
            secret,
            "refused_plain_http",
            f"the placeholder of secret {secret!r} was sent towards {host} over plain HTTP; "
            "secrets are substituted over TLS (https://) only",
        )

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its CA and what was remembered of its secrets."""
        self._seen.pop(sandbox_id, None)
        self.authorities.forget(sandbox_id)
