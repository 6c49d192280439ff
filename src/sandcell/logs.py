"""Logging of `sandcell serve`: readable lines for people, JSON lines for log shippers.

Everything goes to stderr through one handler on the `sandcell` and `uvicorn` loggers. Fields
passed with `extra=` (a request id, a sandbox count, the listening URL) become keys of a JSON
line, and `key=value` pairs after a text line, so the same call serves both formats.
"""

from __future__ import annotations

import json
import logging
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
ACCESS_LOGGER = "sandcell.access"
# Record attributes that are not fields; uvicorn's `color_message` is its message with ANSI codes.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}
# Control characters (C0, DEL, C1) from request data must not forge or garble a log line.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


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
        record.message = (message + pairs).translate(_ESCAPES)
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
