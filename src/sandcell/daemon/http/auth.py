"""The daemon's trust state: bootstrap key, then the one session key set by `POST /init`."""

from __future__ import annotations

import heapq
import time
from typing import Any

from sandcell import tokens
from sandcell.cellapi.environment import validate_env
from sandcell.errors import ErrorCode, ServiceError
from sandcell.ratelimit import TokenBucket, retry_after_header

INIT_RATE_PER_S = 2.0
INIT_BURST = 5
# Seen jtis live until their exp (+ leeway). Past this many live entries the daemon refuses
# new tokens rather than forget unexpired ones, which would re-open replay.
MAX_LIVE_JTIS = 200_000


class ReplayCache:
    """Single-use jtis, each kept until its token can no longer be valid."""

    def __init__(self, capacity: int = MAX_LIVE_JTIS) -> None:
        self.capacity = capacity
        self._seen: set[str] = set()
        self._by_expiry: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def _evict(self, now: float) -> None:
        while self._by_expiry and self._by_expiry[0][0] < now:
            _, jti = heapq.heappop(self._by_expiry)
            self._seen.discard(jti)

    def use(self, jti: str, exp: float) -> None:
        """Marks `jti` used; raises if it was used before or the cache is full."""
        self._evict(time.time())
        if jti in self._seen:
            raise tokens.TokenError("token already used (replay)")
        if len(self._seen) >= self.capacity:
            raise ServiceError(ErrorCode.OVERLOADED, "too many live request tokens")
        self._seen.add(jti)
        heapq.heappush(self._by_expiry, (exp + tokens.LEEWAY_S, jti))


def _unauthenticated(reason: object) -> ServiceError:
    return ServiceError(ErrorCode.UNAUTHENTICATED, f"invalid token: {reason}")


class Guard:
    """Verifies init and request tokens; owns the session key once init succeeded."""

    def __init__(self, sandbox_id: str, bootstrap_key: tokens.PublicKey) -> None:
        self.sandbox_id = sandbox_id
        self._bootstrap_key = bootstrap_key
        self._session_key: tokens.PublicKey | None = None
        self.default_env: dict[str, str] = {}
        self._init_jtis = ReplayCache()
        self._request_jtis = ReplayCache()
        self._init_bucket = TokenBucket(INIT_RATE_PER_S, INIT_BURST)

    @property
    def initialized(self) -> bool:
        return self._session_key is not None

    def initialize(self, token: str) -> None:
        wait = self._init_bucket.try_take()
        if wait:
            raise ServiceError(
                ErrorCode.RATE_LIMITED, "too many init attempts", headers=retry_after_header(wait)
            )
        try:
            verified = tokens.verify_bootstrap_token(token, self._bootstrap_key, self.sandbox_id)
        except tokens.SubjectMismatch as exc:
            raise ServiceError(ErrorCode.FORBIDDEN, str(exc)) from exc
        except tokens.TokenError as exc:
            raise _unauthenticated(exc) from exc
        try:
            self._init_jtis.use(verified.jti, verified.exp)
        except tokens.TokenError as exc:
            raise _unauthenticated(exc) from exc
        if self.initialized:
            raise ServiceError(
                ErrorCode.ALREADY_INITIALIZED, "this daemon already holds a session key"
            )
        session_key, default_env = _init_payload(verified.claims)
        self._session_key = session_key
        self.default_env = default_env

    def check_request(
        self,
        authorization: str | None,
        method: str,
        path_with_query: str,
        body: bytes | None,
        body_required: bool,
    ) -> tokens.VerifiedToken:
        if self._session_key is None:
            raise ServiceError(ErrorCode.NOT_INITIALIZED, "daemon is not initialised")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ServiceError(ErrorCode.UNAUTHENTICATED, "missing bearer token")
        try:
            verified = tokens.verify_request_token(
                token.strip(),
                self._session_key,
                self.sandbox_id,
                method,
                path_with_query,
                body,
                body_required,
            )
            self._request_jtis.use(verified.jti, verified.exp)
        except tokens.TokenError as exc:
            raise _unauthenticated(exc) from exc
        return verified

    @staticmethod
    def check_streamed_body(verified: tokens.VerifiedToken, sha256_digest: bytes) -> None:
        try:
            tokens.check_streamed_body(verified, sha256_digest)
        except tokens.TokenError as exc:
            raise _unauthenticated(exc) from exc


def _init_payload(claims: dict[str, Any]) -> tuple[tokens.PublicKey, dict[str, str]]:
    try:
        session_key = tokens.load_public_key(claims["session_public_key"].encode())
    except ValueError as exc:
        raise _unauthenticated(f"bad session_public_key: {exc}") from exc
    if tokens.algorithm_for(session_key) != "ES256":
        raise _unauthenticated("session key must be P-256")
    env = claims.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _unauthenticated("env claim must map strings to strings")
    validate_env(env, field="env claim")
    return session_key, env
