"""A token bucket: cheap, monotonic-clock based, one per protected resource."""

from __future__ import annotations

import math
import time


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def peek(self) -> float:
        """0 when a token is available, else the seconds until one is (takes nothing)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    def try_take(self) -> float:
        """Takes one token; returns 0 on success, else the seconds until one is available."""
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


def retry_after_header(wait_s: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(wait_s)))}
