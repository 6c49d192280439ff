"""Every substitution and refusal of a secret (SPEC §17): counted in /metrics as
`sandcell_secret_uses_total{secret,decision}`, and kept in `SecretEvents`, a bounded ring in
memory that the audit trail (§20) will read. `SecretUses` is the `UseRecorder` the egress
proxy calls."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from sandcell.audit.records import secret_detail
from sandcell.secrets.bindings import Decision

if TYPE_CHECKING:
    from sandcell.audit.trail import AuditTrail

MAX_EVENTS = 4096


@dataclass(frozen=True, slots=True)
class SecretEvent:
    at: float  # epoch seconds
    sandbox_id: str
    secret: str
    host: str
    decision: Decision


class SecretEvents:
    """The last `capacity` events, oldest dropped first: a buffer for the audit trail to
    drain, not a record of its own (nothing here survives a restart)."""

    def __init__(self, capacity: int = MAX_EVENTS) -> None:
        self._ring: collections.deque[SecretEvent] = collections.deque(maxlen=capacity)

    def add(self, event: SecretEvent) -> None:
        self._ring.append(event)

    def __iter__(self) -> Iterator[SecretEvent]:
        return iter(tuple(self._ring))

    def __len__(self) -> int:
        return len(self._ring)


class SecretUses:
    """A `UseRecorder`: `uses(sandbox_id, secret, host, decision)`."""

    def __init__(self, events: SecretEvents | None = None) -> None:
        self.events = events if events is not None else SecretEvents()  # an empty one is falsy
        self.audit: AuditTrail | None = None  # each use recorded there too (SPEC §20)
        self.counter = Counter(
            "sandcell_secret_uses",
            "Secret placeholders the egress proxy substituted or refused",
            ["secret", "decision"],
            registry=None,
        )

    def __call__(self, sandbox_id: str, secret: str, host: str, decision: Decision) -> None:
        self.counter.labels(secret, decision).inc()
        self.events.add(SecretEvent(time.time(), sandbox_id, secret, host, decision))
        if self.audit is not None:  # the sandbox's own code used it: its owner acts
            status = 200 if decision == "substituted" else 403
            detail = secret_detail(name=secret, host=host, decision=decision)
            self.audit.note(
                "secret.use", sandbox_id=sandbox_id, status=status, touched=detail, owner=True
            )

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(self.counter)
