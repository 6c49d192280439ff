"""Logging of `sandcell serve`: readable lines for people, JSON lines for log shippers.

Everything goes to stderr through one handler on the `sandcell` and `uvicorn` loggers. Fields
passed with `extra=` (a request id, a sandbox count, the listening URL) become keys of a JSON
line, and `key=value` pairs after a text line, so the same call serves both formats.

Logs a client cannot forge or flood: `printable` escapes what a client sent (a decoded `%0a`
in a path would otherwise start a line of the client's own), at the call sites and again in the
text formatter; `RepeatFilter` collapses a warning repeated within a window (a resource error
on every accept, every probe) into its first occurrence plus a count.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
ACCESS_LOGGER = "sandcell.access"
# Record attributes that are not fields; uvicorn's `color_message` is its message with ANSI codes.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


def counted(n: int, one: str, many: str) -> str:
    """`1 sandbox`, `3 sandboxes`: log lines are read by people."""
    return f"{n} {one if n == 1 else many}"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """What the caller passed with `extra=`, in the order given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **extra_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`2026-12-01 03:50:01 INFO  message key=value ...`, control characters escaped."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-5s %(message)s", "%Y-%m-%d %H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        pairs = "".join(f" {k}={v}" for k, v in _news(extra_fields(record), message))
        record.message = printable(message + pairs)
        return super().formatMessage(record)


def _news(fields: dict[str, Any], message: str) -> list[tuple[str, Any]]:
    """The fields a reader of `message` does not know yet: scalars it does not show (lists
    and tables are for machines, in JSON lines)."""
    return [
        (k, v)
        for k, v in fields.items()
        if isinstance(v, str | int | float) and str(v) not in message
    ]


def configure(log_format: str = "text", level: str = "info", access_log: bool = True) -> None:
    """Route sandcell's and uvicorn's records to stderr in `log_format` (see FORMATS)."""
    if log_format not in FORMATS or level not in LEVELS:
        raise ValueError(f"log format {log_format!r} / level {level!r} not in {FORMATS} / {LEVELS}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    for name in ("sandcell", "uvicorn"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    logging.getLogger("sandcell").setLevel(level.upper())
    logging.getLogger(ACCESS_LOGGER).disabled = not access_log


REPEAT_WINDOW_S = 10.0
MAX_TRACKED = 1024
# Loggers whose handlers (or, without handlers of their own, the loggers) get the filter.
NOISY_LOGGERS = ("sandcell", "uvicorn.error", "asyncio")


def printable(text: str) -> str:
    """`text` with control and other non-printable characters as Python escapes (`\\n`,
    `\\x1b`, `\\u202e`); the common case (all printable) costs one C-level scan."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class RepeatFilter(logging.Filter):
    """Passes the first WARNING-or-worse record of each (logger, level, message template)
    per window and drops the rest; the first one after a window reports how many were
    dropped. INFO (the access log) always passes: it is the record of what was served."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        # A record may meet this filter twice (on its logger, then on a handler).
        decided = getattr(record, "_repeat_pass", None)
        if decided is None:
            decided = self._first_in_window(record)
            record._repeat_pass = decided
        return decided

    def _first_in_window(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        started, dropped = self._seen.get(key, (0.0, 0))
        if now - started < self.window_s:
            self._seen[key] = (started, dropped + 1)
            return False
        if len(self._seen) >= MAX_TRACKED:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like this in the last {self.window_s:g} s)"
        return True


def quiet_repeats(window_s: float = REPEAT_WINDOW_S) -> None:
    """Installs one `RepeatFilter` on sandcell's, uvicorn's and asyncio's loggers (their own
    records), on their handlers and the root's (records propagated from child loggers); call
    it once logging is configured."""
    repeats = RepeatFilter(window_s)
    root = logging.getLogger()
    targets: list[logging.Filterer] = [*root.handlers]
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        targets += [logger, *logger.handlers]
    for target in targets:
        if not any(isinstance(f, RepeatFilter) for f in target.filters):
            target.addFilter(repeats)
