"""The limits of one HTTP server's connections (light: settings import it, not uvicorn)."""

from __future__ import annotations

import resource
from dataclasses import dataclass

# Descriptors kept for everything that is not a client: cells' sockets, the store, logs.
MIN_FD_RESERVE = 256
TIMED_OUT = "sandcell.body_timed_out"  # scope key: the guard cut this request's body


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 5.0
    max_header_bytes: int = 65_536
    body_timeout_s: float = 10.0
    min_body_rate: int = 16_384  # bytes/s a body must average once its grace is spent
    max_connections: int = 0  # 0: derived from RLIMIT_NOFILE

    def connection_cap(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = max(16, soft - max(MIN_FD_RESERVE, soft // 4))
        return min(self.max_connections, ceiling) if self.max_connections else ceiling
