"""Traces (SPEC §20): OpenTelemetry spans of the router's calls, exported over OTLP/HTTP.

Off unless `[telemetry] otlp_endpoint` is set; then `enable` loads the OpenTelemetry SDK
(`telemetry.otel`, the `telemetry` extra) and `active` holds its `Tracing`. Until then
nothing of OpenTelemetry is imported, and every wiring point pays one None check:

- `router.middleware`: the server span of each API call, a child of the caller's W3C
  `traceparent` when it sent a valid one (a bad one is ignored);
- `router.core.Hop.exchange`: the span of the hop to the daemon, named in the `traceparent`
  it sends; the daemon's own steps come back in its answer (`cellapi.spans`) and become
  child spans with their own times, clamped inside the hop's;
- `span(...)` blocks in the manager (warm claim, cell start, init), the egress proxies (one
  span per connection) and the image builder.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from sandcell.telemetry.otel import Tracing

active: Tracing | None = None
SDK_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


class TelemetryConfigError(ValueError):
    pass


def check_endpoint(value: Any) -> str:
    """`[telemetry] otlp_endpoint`: an http(s) URL of an OTLP/HTTP receiver, its base
    (spans go to `/v1/traces` beneath it) or its full traces URL."""
    name = "[telemetry] otlp_endpoint"
    if not isinstance(value, str) or not value:
        raise TelemetryConfigError(f"{name} must be a URL, e.g. http://127.0.0.1:4318")
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        raise TelemetryConfigError(f"{name}: {value!r} is not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise TelemetryConfigError(
            f"{name}: {value!r} must be an http:// or https:// URL with a host"
        )
    if url.username is not None or url.password is not None:
        raise TelemetryConfigError(f"{name}: credentials in the URL are refused")
    if url.query or url.fragment:
        raise TelemetryConfigError(f"{name}: {value!r} must have no query or fragment")
    if not all(_installed(m) for m in SDK_MODULES):  # looked up, not imported
        raise TelemetryConfigError(
            f"{name} needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'sandcell[telemetry]'"
        )
    return value


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def traces_url(endpoint: str) -> str:
    """Where spans are posted: OTEL_EXPORTER_OTLP_ENDPOINT's rule (the base + /v1/traces),
    unless the URL names that path already."""
    if urlsplit(endpoint).path.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


def enable(endpoint: str) -> Tracing:
    """Tracing on, exporting to `endpoint` (this imports the OpenTelemetry SDK)."""
    global active
    from sandcell.telemetry.otel import Tracing, otlp_exporter

    active = Tracing(otlp_exporter(traces_url(endpoint)))
    return active


def disable() -> None:
    """Tracing off; the spans still queued are exported first."""
    global active
    tracing, active = active, None
    if tracing is not None:
        tracing.shutdown()


Attributes = Mapping[str, str | int | bool]


def span(name: str, attributes: Attributes | None = None) -> contextlib.AbstractContextManager[Any]:
    """A block as a span (a child of the current one), or a shared no-op when tracing is off."""
    tracing = active
    if tracing is None:
        return _OFF
    return tracing.span(name, attributes or {})


def annotate(attributes: Attributes) -> None:
    """Attributes on the current span (when tracing is on and one is being recorded)."""
    tracing = active
    if tracing is not None:
        tracing.annotate(attributes)
