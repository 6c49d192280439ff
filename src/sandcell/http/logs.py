"""Logs that a client cannot forge or flood.

`printable` escapes what a client sent before it reaches a log line: a decoded `%0a` in a
path would otherwise start a line of the client's own. `RepeatFilter` collapses a warning
repeated within a window (a resource error on every accept, every probe) into its first
occurrence plus a count, so a fault cannot fill the disk at megabytes a second.
"""

from __future__ import annotations

import logging
import time

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

    def __init__(self, window_s: float = REPEAT_WINDOW_S) -> None:
        super().__init__()
        self.window_s = window_s
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
        now = time.monotonic()
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
