"""API keys: who is calling, and a brake on guessing keys.

The brake slows failures only: a valid key is served whatever its address did before, so
clients behind one NAT or proxy cannot lock each other out with a typo or a stale key. That
leaves a guesser its answer at full speed, which is fine: a key holds 256 random bits (160 in
E2B's shape), so what the brake protects is the store and the log from a flood of failures,
not the keys.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from sandcell.errors import ErrorCode, ServiceError
from sandcell.ratelimit import TokenBucket, retry_after_header
from sandcell.store import Store, hash_api_key

# Failed attempts per client address: a burst of 10, then one every 2 s.
FAILURE_BURST = 10
FAILURE_RATE_PER_S = 0.5
MAX_TRACKED_CLIENTS = 10_000


@dataclass(frozen=True)
class Principal:
    name: str
    admin: bool
    key_name: str = ""  # the API key's own name, for the audit trail

    def owns(self, owner: str) -> bool:
        return self.admin or owner == self.name


class Authenticator:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._failures: OrderedDict[str, TokenBucket] = OrderedDict()

    async def authenticate(self, authorization: str | None, client: str) -> Principal:
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            # The lookup is by SHA-256 of the key: nothing secret is compared byte by byte.
            record = await self.store.get_api_key_by_hash(hash_api_key(key.strip()))
            if record is not None and not record.revoked:
                return Principal(record.principal, record.admin, record.name)
        self._check_not_blocked(client)
        self._record_failure(client)
        raise ServiceError(ErrorCode.UNAUTHENTICATED, "missing, unknown or revoked API key")

    def _bucket(self, client: str) -> TokenBucket:
        bucket = self._failures.pop(client, None) or TokenBucket(FAILURE_RATE_PER_S, FAILURE_BURST)
        self._failures[client] = bucket
        while len(self._failures) > MAX_TRACKED_CLIENTS:
            self._failures.popitem(last=False)
        return bucket

    def _check_not_blocked(self, client: str) -> None:
        bucket = self._failures.get(client)
        if bucket is not None and (wait := bucket.peek()):
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                "too many failed authentications",
                headers=retry_after_header(wait),
            )

    def _record_failure(self, client: str) -> None:
        self._bucket(client).try_take()
