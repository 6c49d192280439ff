"""What each caller holds of the router, and the bounds on it: the one shared door.

Three things are held, each as a context manager by the code that takes it, and each given
back there whatever happens:

- an in-flight **slot** per request (each key its fair share; callers without a key, such as
  preview URLs, share a bounded part of the slots between them),
- a **byte lease** for a request body buffered in memory (`budget.ByteBudget`),
- a **session** per WebSocket relayed to a sandbox (each holds two descriptors, so they are
  bounded per key and in all, below the process's file limit).

An HTTP request's holds live in an `ExitStack` that `RequestContext` opens for it and closes
when the request ends (a streamed answer included), so a handler only says who pays.
"""

from __future__ import annotations

import contextlib
import resource
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from starlette.types import Scope

from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import BODY_BUDGET
from sandcell.http.limits import MIN_FD_RESERVE
from sandcell.router.budget import ByteBudget

MIB = 1_048_576
HOLDS = "sandcell.holds"  # scope key: the request's ExitStack
PAYER = "sandcell.payer"  # scope key: whose slot the request holds
ANONYMOUS = "anonymous"  # the shared pool of callers without a key
RETRY_AFTER = {"Retry-After": "1"}


def anonymous(owner: str) -> str:
    """The account a keyless caller of `owner`'s sandbox pays from (a preview URL's): not the
    owner's own share, so visitors cannot take the slots the owner's API calls need."""
    return f"anonymous:{owner}"


@dataclass(frozen=True)
class Limits:
    max_inflight: int = 512
    max_sandboxes_per_key: int = 100
    max_inflight_per_key: int = 0  # 0: a quarter of max_inflight
    max_inflight_anonymous: int = 0  # 0: a quarter of max_inflight, for all keyless callers
    body_budget_bytes: int = 128 * MIB
    body_budget_per_key_bytes: int = 32 * MIB
    max_sessions_per_key: int = 64
    max_sessions: int = 0  # 0: derived from RLIMIT_NOFILE

    def inflight_share(self) -> int:
        return self.max_inflight_per_key or max(1, self.max_inflight // 4)

    def anonymous_share(self) -> int:
        return self.max_inflight_anonymous or max(1, self.max_inflight // 4)

    def session_cap(self) -> int:
        """Each session holds the client's connection and the daemon's: together at most a
        quarter of the descriptors the connection cap leaves, so sessions cannot starve the
        cells' sockets, the store or new API connections."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = max(8, (soft - MIN_FD_RESERVE) // 8)
        return min(self.max_sessions, ceiling) if self.max_sessions else ceiling


class Counts:
    """Holders per account, bounded per account and in all; the anonymous accounts also
    share one bound of their own."""

    def __init__(self, what: str, per_key: int, total: int, anonymous_total: int) -> None:
        self.what = what
        self.per_key = per_key
        self.total = total
        self.anonymous_total = anonymous_total
        self.by_key: Counter[str] = Counter()
        self.anonymous = 0
        self.held = 0

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        keyless = key.startswith(ANONYMOUS)
        who = "this sandbox's preview visitors have" if keyless else "this key has"
        if self.by_key[key] >= self.per_key:
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                f"{who} {self.per_key} {self.what} already",
                {"limit": self.per_key},
                headers=RETRY_AFTER,
            )
        if keyless and self.anonymous >= self.anonymous_total:
            raise ServiceError(
                ErrorCode.OVERLOADED,
                f"too many {self.what} of preview visitors at once",
                {"limit": self.anonymous_total},
                headers=RETRY_AFTER,
            )
        if self.held >= self.total:
            raise ServiceError(
                ErrorCode.OVERLOADED, f"too many {self.what} at once", headers=RETRY_AFTER
            )
        self.by_key[key] += 1
        self.held += 1
        self.anonymous += keyless
        try:
            yield
        finally:
            self.by_key[key] -= 1
            if not self.by_key[key]:
                del self.by_key[key]
            self.held -= 1
            self.anonymous -= keyless


class Door:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits = limits or Limits()
        share = limits.inflight_share()
        self.slots = Counts(
            "requests in flight", share, limits.max_inflight, limits.anonymous_share()
        )
        sessions = limits.session_cap()
        self.sessions = Counts(
            "open WebSocket sessions",
            min(limits.max_sessions_per_key, sessions),
            sessions,
            max(1, sessions // 2),
        )
        self.bodies = ByteBudget(limits.body_budget_bytes, limits.body_budget_per_key_bytes)

    def admit(self, scope: Scope, key: str) -> None:
        """The HTTP request of `scope` holds one of `key`'s slots and reads its body from
        `key`'s byte budget until it ends; a request pays once, whoever it names later."""
        holds: contextlib.ExitStack | None = scope.get(HOLDS)
        if holds is None:
            raise RuntimeError("admit() outside a request that RequestContext tracks")
        if PAYER in scope:
            return
        holds.enter_context(self.slots.hold(key))
        scope[PAYER] = key
        scope[BODY_BUDGET] = holds.enter_context(self.bodies.leased(key))

    def session(self, key: str) -> contextlib.AbstractContextManager[None]:
        """One WebSocket session of `key`, for as long as it is relayed."""
        return self.sessions.hold(key)
