"""Prometheus metrics of one router process (a registry of its own, not the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sandcell_requests_total",
            "HTTP requests by route and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sandcell_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=self.registry,
        )
        self.sandboxes = Gauge(
            "sandcell_sandboxes", "Sandboxes by state", ["state"], registry=self.registry
        )
        self.pool_ready = Gauge(
            "sandcell_pool_ready",
            "Ready cells in each warm pool",
            ["template"],
            registry=self.registry,
        )
        self.init_failures = Gauge(
            "sandcell_init_failures", "Failed two-stage inits", registry=self.registry
        )
        self.daemon_calls = Counter(
            "sandcell_daemon_calls_total",
            "Signed calls to sandboxes' daemons (Router.send), by method",
            ["method"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "sandcell_inflight_requests", "Requests being served", registry=self.registry
        )
