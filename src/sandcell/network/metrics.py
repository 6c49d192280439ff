"""Egress counters, registered into the router's registry so that /metrics shows them."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class EgressMetrics:
    def __init__(self, held: Callable[[], int] = lambda: 0) -> None:
        self.decisions = Counter(
            "sandcell_egress",
            "Egress proxy decisions (allowed or refused)",
            ["decision"],
            registry=None,
        )
        self.limited = Counter(
            "sandcell_egress_limited",
            "Egress connections refused at a bound (sandbox, owner, total)",
            ["bound"],
            registry=None,
        )
        self.connections = Gauge(
            "sandcell_egress_connections",
            "Connections open through the egress proxies, every sandbox together",
            registry=None,
        )
        self.connections.set_function(held)
        self.bytes = Counter(
            "sandcell_egress_bytes",
            "Bytes relayed by the egress proxies (out: from cells, in: to cells)",
            ["direction"],
            registry=None,
        )

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(self.decisions)
        registry.register(self.limited)
        registry.register(self.connections)
        registry.register(self.bytes)
