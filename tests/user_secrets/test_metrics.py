"""The secret-use recorder the egress proxy calls (SPEC §17): counted for /metrics by secret
and decision, and kept in a bounded ring for the audit trail."""

from __future__ import annotations

from prometheus_client import generate_latest

from sandcell.router.metrics import RouterMetrics
from sandcell.secrets.bindings import UseRecorder
from sandcell.secrets.metrics import SecretEvents, SecretUses


def test_counted_on_the_routers_registry() -> None:
    metrics = RouterMetrics()
    uses = SecretUses()
    uses.register(metrics.registry)
    recorder: UseRecorder = uses  # what network/tls is handed
    recorder("sbx-1", "OPENAI_API_KEY", "api.openai.com", "substituted")
    recorder("sbx-1", "OPENAI_API_KEY", "api.openai.com", "substituted")
    recorder("sbx-1", "OPENAI_API_KEY", "evil.example", "refused_host")
    text = generate_latest(metrics.registry).decode()
    assert 'sandcell_secret_uses_total{decision="substituted",secret="OPENAI_API_KEY"} 2.0' in text
    assert 'sandcell_secret_uses_total{decision="refused_host",secret="OPENAI_API_KEY"} 1.0' in text
    last = list(uses.events)[-1]
    assert (last.sandbox_id, last.secret, last.host, last.decision) == (
        "sbx-1",
        "OPENAI_API_KEY",
        "evil.example",
        "refused_host",
    )


def test_the_ring_is_bounded() -> None:
    uses = SecretUses(SecretEvents(capacity=3))
    for i in range(10):
        uses(f"sbx-{i}", "K", "h.example", "deleted")
    assert len(uses.events) == 3
    assert [e.sandbox_id for e in uses.events] == ["sbx-7", "sbx-8", "sbx-9"]
