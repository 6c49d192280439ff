"""Open a store from its URL, as given in the config or on the command line."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio

from .base import Store
from .crypto import Sealer
from .redis import RedisStore
from .sqlite import SQLiteStore

_REDIS_SCHEMES = ("redis", "rediss", "unix")
_USAGE = (
    "expected sqlite:///abs/path.db, sqlite:relative/path.db, redis://host:port/db, "
    "rediss://host:port/db or unix:///path/to/socket"
)


def _sqlite_path(rest: str) -> Path:
    """`rest` is what follows `sqlite:`: `///abs` (or SQLAlchemy's `////abs`) or `relative`."""
    if rest.startswith("//"):
        rest = rest[2:]
        if not rest.startswith("/"):
            raise ValueError(f"sqlite store URL must not name a host; {_USAGE}")
        rest = "/" + rest.lstrip("/")
    if not rest.strip("/"):
        raise ValueError(f"sqlite store URL has no file path; {_USAGE}")
    return Path(rest).absolute()


def open_store(url: str, sealer: Sealer) -> Store:
    """Open (and for SQLite, create) the store at `url`. Redis connects lazily: call `ping()`.

    Error messages never repeat the URL, which may carry a password.
    """
    scheme, _, rest = url.partition(":")
    if scheme == "sqlite":
        return SQLiteStore(_sqlite_path(rest), sealer)
    if scheme in _REDIS_SCHEMES:
        try:
            client = redis.asyncio.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        except ValueError as e:
            raise ValueError(f"invalid {scheme}:// store URL ({e}); {_USAGE}") from None
        return RedisStore(client, sealer)
    raise ValueError(f"unsupported store URL scheme {scheme!r}; {_USAGE}")
