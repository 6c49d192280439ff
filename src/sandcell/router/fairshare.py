"""Each key's fair share of the in-flight slots: one key cannot take them all.

Checked once a request's principal is known (after authentication), so slots held by
requests still being authenticated are bounded by the global in-flight cap alone.
"""

from __future__ import annotations

from starlette.types import Scope

from sandcell.errors import ErrorCode, SandcellError

PRINCIPAL = "sandcell.principal"  # scope key: whose slot this request holds


class FairShare:
    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._inflight: dict[str, int] = {}

    def admit(self, scope: Scope, key: str) -> None:
        if PRINCIPAL in scope:
            return  # this request holds its slot already
        count = self._inflight.get(key, 0)
        if count >= self.per_key:
            raise SandcellError(
                ErrorCode.RATE_LIMITED,
                f"this key already has {self.per_key} requests in flight",
                {"limit": self.per_key},
                headers={"Retry-After": "1"},
            )
        self._inflight[key] = count + 1
        scope[PRINCIPAL] = key

    def release(self, scope: Scope) -> None:
        key = scope.get(PRINCIPAL)
        if key is None:
            return
        count = self._inflight[key] - 1
        if count:
            self._inflight[key] = count
        else:
            del self._inflight[key]
