"""The node roster's rules (SPEC §18): what a node may report, and when it counts as gone.

Both backends store what `check_node` let through, so the two agree on what a record can
hold. Errors name the field and never echo the value: a report comes from the network.
Liveness is computed from the last heartbeat and the reader's clock (hosts keep their clocks
in step, NTP's millisecond skew is nothing against the window), never stored, so a node that
died without a word turns unreachable by itself.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any, Literal

from sandcell.errors import ErrorCode, ServiceError

from .records import NODE_STATES, NodeRecord

# Settings-ready: how often a node reports, and how many reports in a row it may miss before
# routers stop placing on it and its sandboxes answer SANDBOX_UNREACHABLE.
HEARTBEAT_INTERVAL_S = 2.0
MISSED_HEARTBEATS = 3
LIVENESS_WINDOW_S = HEARTBEAT_INTERVAL_S * MISSED_HEARTBEATS

Liveness = Literal["live", "unreachable"]

# A DNS label (RFC 1123): the name is a host name, a Kubernetes node name, a key part.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
# Kubernetes' label syntax, so a DaemonSet can copy its machine's labels as they are.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_NAME = re.compile(NAME_PATTERN)
_HOST_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9.+_]{0,63}$")
MAX_LABELS = 64
MAX_MB = 2**40  # memory or disk, in MB: an exbibyte, far past any host, well inside 64 bits
MAX_CPUS = 65_536.0
MAX_CELLS = 1_000_000


def _bad(field: str, why: str) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, f"node {field}: {why}", {"field": field})


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad("name", "must be a DNS label (a-z, 0-9 and '-', at most 63, no '-' at an end)")
    return name


def _check_address(address: Any) -> None:
    if not isinstance(address, str) or len(address) > 300:
        raise _bad("address", "must be host:port")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad("address", "must be host:port with a port from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise _bad("address", "holds a bracketed host that is not an IPv6 address") from None
        return
    parts = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_NAME.fullmatch(p) for p in parts):
        raise _bad("address", "host must be a DNS name, an IPv4 address or [an IPv6 address]")


def _check_labels(labels: Any) -> None:
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise _bad("labels", f"must be at most {MAX_LABELS} string pairs")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise _bad("labels", "a key is not a label key ([prefix/]name, as in Kubernetes)")
        if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
            raise _bad("labels", "a value is not a label value (at most 63 of A-Z a-z 0-9 -_.)")


def _number(field: str, value: Any, top: float, whole: bool) -> None:
    kinds: tuple[type, ...] = (int,) if whole else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= top:
        kind = "a whole number" if whole else "a number"
        raise _bad(field, f"must be {kind} from 0 to {top:g}")


def check_node(rec: NodeRecord) -> None:
    """Raise a 400 ServiceError naming the first field of `rec` a node may not report."""
    check_name(rec.name)
    _check_address(rec.address)
    if not isinstance(rec.version, str) or not _VERSION.fullmatch(rec.version):
        raise _bad("version", "must be 1 to 64 of A-Z a-z 0-9 .+-_")
    if rec.state not in NODE_STATES:
        raise _bad("state", f"must be one of {sorted(NODE_STATES)}")
    _check_labels(rec.labels)
    for field in ("heartbeat_at", "registered_at"):
        _number(field, getattr(rec, field), 1e11, whole=False)
    for total, free, top in (
        ("memory_mb", "free_memory_mb", MAX_MB),
        ("cpus", "free_cpus", MAX_CPUS),
        ("disk_mb", "free_disk_mb", MAX_MB),
    ):
        whole = total != "cpus"
        _number(total, getattr(rec, total), top, whole)
        _number(free, getattr(rec, free), getattr(rec, total), whole)  # never more than all
    _number("cells", rec.cells, MAX_CELLS, whole=True)
    # More live cells than cells is allowed: capacity lowered under cells still running.
    _number("live_cells", rec.live_cells, MAX_CELLS, whole=True)


def liveness(rec: NodeRecord, now: float, window_s: float = LIVENESS_WINDOW_S) -> Liveness:
    """`unreachable` once the last heartbeat is more than `window_s` old at `now`."""
    return "unreachable" if now - rec.heartbeat_at > window_s else "live"
