"""Where the router is and how to call it: arguments first, then the environment."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8700"
URL_ENV = "SANDCELL_URL"
API_KEY_ENV = "SANDCELL_API_KEY"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait before repeating a request that failed transiently.

    Only failures that cannot have done anything are repeated for every call: a connection
    that was never established, and a 429/503 answer (the server refused the work). A
    connection that broke after the request was sent, and a 500, are repeated only for
    idempotent calls.
    """

    max_retries: int = 3
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0
    max_retry_after_s: float = 10.0

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: between half and all of base * 2**attempt."""
        ceiling = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return ceiling * (0.5 + random.random() / 2)  # noqa: S311 - jitter, not crypto

    def retry_after(self, seconds: float | None, attempt: int) -> float:
        if seconds is None:
            return self.backoff(attempt)
        return min(seconds, self.max_retry_after_s)


@dataclass(frozen=True)
class ClientConfig:
    """`url` of the router, `api_key`, the default request `timeout` (seconds; commands get
    their own timeout plus a margin), the `connect_timeout`, and the retry policy.

    `transport` (an `httpx.BaseTransport`, for `Sandbox`) and `async_transport` (an
    `httpx.AsyncBaseTransport`, for `AsyncSandbox`) replace the network: an
    `httpx.MockTransport` or an ASGI transport runs the SDK's logic in-process."""

    url: str = DEFAULT_URL
    api_key: str | None = None
    timeout: float = 60.0
    connect_timeout: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    transport: Any = field(default=None, compare=False)
    async_transport: Any = field(default=None, compare=False)

    @classmethod
    def resolve(
        cls,
        url: str | None = None,
        api_key: str | None = None,
        config: ClientConfig | None = None,
    ) -> ClientConfig:
        """Explicit arguments win, then `config`, then SANDCELL_URL / SANDCELL_API_KEY."""
        base = config or cls(
            url=os.environ.get(URL_ENV) or DEFAULT_URL,
            api_key=os.environ.get(API_KEY_ENV) or None,
        )
        changes: dict[str, Any] = {}
        if url:
            changes["url"] = url
        if api_key:
            changes["api_key"] = api_key
        resolved = replace(base, **changes) if changes else base
        if not resolved.url.startswith(("http://", "https://")):
            from sandcell.client.errors import ConfigurationError

            raise ConfigurationError(
                f"the server URL must start with http:// or https://, got {resolved.url!r}"
            )
        return replace(resolved, url=resolved.url.rstrip("/"))

    def headers(self) -> dict[str, str]:
        from sandcell import __version__

        headers = {"user-agent": f"sandcell-python/{__version__}"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    def __repr__(self) -> str:  # never print the key
        key = "set" if self.api_key else None
        return f"ClientConfig(url={self.url!r}, api_key={key}, timeout={self.timeout})"


def retry_policy(url: str | None, api_key: str | None, config: ClientConfig | None) -> RetryPolicy:
    """The retry policy of a class-level call (its transport is made from the same args)."""
    return ClientConfig.resolve(url, api_key, config).retry
