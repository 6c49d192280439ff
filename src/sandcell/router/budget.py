"""A byte budget for request bodies buffered in memory, in total and per key.

A body is paid for before it is read (its declared Content-Length) or as it arrives
(chunked), and paid back when its request ends, so `total` bounds what buffered bodies can
grow the router by however many arrive at once, and one key cannot take more than `per_key`
of it. Over budget is an immediate 429 (this key) or 503 (everyone), never a queue.

Bodies up to `FREE_BYTES` are not counted: the in-flight cap already bounds them (uvicorn
holds that much per connection anyway), so an API call or a small exec is never refused
because big uploads hold the budget, and costs no bookkeeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sandcell.errors import ErrorCode, ServiceError

RETRY_AFTER = {"Retry-After": "1"}
FREE_BYTES = 65_536


class ByteBudget:
    def __init__(self, total: int, per_key: int) -> None:
        self.total = total
        self.per_key = per_key
        self.used = 0
        self._by_key: dict[str, int] = {}

    @contextlib.contextmanager
    def leased(self, key: str) -> Iterator[Lease]:
        """What one request may hold of the budget, given back when it ends."""
        lease = Lease(self, key)
        try:
            yield lease
        finally:
            lease.release()

    def _take(self, key: str, n: int) -> None:
        held = self._by_key.get(key, 0)
        if held + n > self.per_key:
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                "this key has too many request bodies in flight",
                {"limit_bytes": self.per_key},
                headers=RETRY_AFTER,
            )
        if self.used + n > self.total:
            raise ServiceError(
                ErrorCode.OVERLOADED, "too many request bodies in flight", headers=RETRY_AFTER
            )
        self._by_key[key] = held + n
        self.used += n

    def _give_back(self, key: str, n: int) -> None:
        self.used -= n
        left = self._by_key[key] - n
        if left:
            self._by_key[key] = left
        else:
            del self._by_key[key]


class Lease:
    """What one request holds of the budget; `cover(n)` grows it to at least `n` bytes."""

    __slots__ = ("_budget", "_key", "held")

    def __init__(self, budget: ByteBudget, key: str) -> None:
        self._budget = budget
        self._key = key
        self.held = 0

    def cover(self, size: int) -> None:
        if size > self.held and size > FREE_BYTES:
            self._budget._take(self._key, size - self.held)
            self.held = size

    def release(self) -> None:
        if self.held:
            self._budget._give_back(self._key, self.held)
            self.held = 0
