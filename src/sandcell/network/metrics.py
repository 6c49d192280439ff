"""Egress counters, registered into the router's registry so that /metrics shows them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class EgressMetrics:
    def __init__(self) -> None:
        self.decisions = Counter(
            "sandcell_egress",
            "Egress proxy decisions (allowed or refused)",
            ["decision"],
            registry=None,
        )
        self.bytes = Counter(
            "sandcell_egress_bytes",
            "Bytes relayed by the egress proxies (out: from cells, in: to cells)",
            ["direction"],
            registry=None,
        )

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(self.decisions)
        registry.register(self.bytes)
