"""What a run produces, in the API's shapes (SPEC §10), bounded and always valid JSON.

The kernel is the tenant's own process: whatever it sends is untrusted. Every event is rebuilt
here from known fields (MIME bundles keep only the types the API names, as strings), output is
decoded with replacement and capped like exec's, and results have a byte budget per run, so
binary junk or a flood can neither break the NDJSON stream nor fill the daemon's memory.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandcell.daemon.exec.runner import CappedOutput
from sandcell.http.ndjson import line

MIME_TYPES = (
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
    "application/javascript",
    "application/pdf",
    "e2b/chart",  # a matplotlib figure's data, in E2B's chart shape (ipython_driver.py)
)
JSON_TYPES = ("application/json", "e2b/chart")  # kept as JSON; every other type a string
MAX_RESULT_BYTES = 8 * 1_048_576  # per run, all results together
STREAM_FLUSH_S = 0.2  # a line's start is sent after this without its end (Jupyter's interval)
MAX_TEXT_FIELD = 1_048_576  # an error's name, value or traceback

Event = dict[str, Any]
EventSink = Callable[[Event], None]


def clean_text(value: Any, limit: int = MAX_TEXT_FIELD) -> str:
    """A string that encodes to JSON and UTF-8 (lone surrogates replaced), at most `limit`."""
    text = value if isinstance(value, str) else str(value)
    return text[:limit].encode("utf-8", "replace").decode("utf-8")


def result_bundle(data: Any) -> dict[str, Any]:
    """The known MIME types of a kernel's bundle; JSON data stays JSON, the rest strings."""
    if not isinstance(data, dict):
        return {}
    bundle: dict[str, Any] = {}
    for mime in MIME_TYPES:
        if mime not in data:
            continue
        value = data[mime]
        if mime not in JSON_TYPES:
            bundle[mime] = clean_text(value, 1 << 62)
        elif mime != "e2b/chart" or isinstance(value, dict):  # a chart is an object or none
            bundle[mime] = value
    return bundle


def error_event(name: Any, value: Any, traceback: Any = "") -> Event:
    return {
        "type": "error",
        "name": clean_text(name, 1024),
        "value": clean_text(value),
        "traceback": clean_text(traceback),
    }


def timeout_error(why: str) -> Event:
    return error_event("TimeoutError", f"{why}: it was interrupted; the context keeps its state")


@dataclass
class RunOutput:
    """The events of one run: handed to `sink` as they come, and kept for a buffered reply."""

    sink: EventSink | None
    max_output_bytes: int
    started: float = field(default_factory=time.monotonic)
    results: list[dict[str, Any]] = field(default_factory=list)
    error: Event | None = None
    results_truncated: bool = False
    interrupted: str | None = None  # why the daemon interrupted the run, if it did
    _result_bytes: int = 0

    def __post_init__(self) -> None:
        self.streams = {n: CappedOutput(self.max_output_bytes) for n in ("stdout", "stderr")}
        self.text: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._decoders = {
            n: codecs.getincrementaldecoder("utf-8")("replace") for n in ("stdout", "stderr")
        }
        # Output streams by line, as Jupyter's does: `print("hi")` is one "hi\n" event, not
        # "hi" and "\n". A line's start waits for its end at most STREAM_FLUSH_S.
        self._pending = {"stdout": "", "stderr": ""}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def output(self, stream: str, data: bytes, final: bool = False) -> None:
        kept = self.streams[stream].add(data)
        text = self._decoders[stream].decode(kept, final=final)
        if text:
            self.text[stream].append(text)
        pending = self._pending[stream] + text
        cut = len(pending) if final else pending.rfind("\n") + 1
        self._pending[stream] = pending[cut:]
        if cut:
            self._emit({"type": stream, "text": pending[:cut]})
        if self._pending[stream] and stream not in self._timers:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a caller outside the daemon): no waiting either
                self.flush()
                return
            self._timers[stream] = loop.call_later(STREAM_FLUSH_S, self._flush_stream, stream)

    def _flush_stream(self, stream: str) -> None:
        timer = self._timers.pop(stream, None)
        if timer is not None:
            timer.cancel()
        if text := self._pending[stream]:
            self._pending[stream] = ""
            self._emit({"type": stream, "text": text})

    def flush(self) -> None:
        """Sends the lines begun and not ended: before a result, an error and the end."""
        for stream in ("stdout", "stderr"):
            self._flush_stream(stream)

    def result(self, data: Any, is_main: bool) -> None:
        self.flush()
        bundle = result_bundle(data)
        size = len(line(bundle))
        if self._result_bytes + size > MAX_RESULT_BYTES:
            self.results_truncated = True
            return
        self._result_bytes += size
        result = {"is_main_result": bool(is_main), **bundle}
        self.results.append(result)
        self._emit({"type": "result", **result})

    def fail(self, error: Event) -> None:
        if self.interrupted is not None and error["name"] == "KeyboardInterrupt":
            # The interrupt was the daemon's: say so, keep the kernel's traceback.
            timeout = timeout_error(self.interrupted)
            error = {**error, "name": timeout["name"], "value": timeout["value"]}
        self.error = error
        self.flush()
        self._emit(error)

    def _emit(self, event: Event) -> None:
        if self.sink is not None:
            self.sink(event)

    def summary(self, execution_count: int | None, timed_out: bool) -> dict[str, Any]:
        """The fields of the end event (and of the buffered reply)."""
        self.flush()
        return {
            "execution_count": execution_count,
            "duration_s": round(time.monotonic() - self.started, 6),
            "timed_out": timed_out,
            "stdout_truncated": self.streams["stdout"].truncated,
            "stderr_truncated": self.streams["stderr"].truncated,
            "results_truncated": self.results_truncated,
        }

    def reply(self, summary: dict[str, Any]) -> dict[str, Any]:
        error = None
        if self.error is not None:
            error = {k: v for k, v in self.error.items() if k != "type"}
        return {
            "stdout": _lines(self.text["stdout"]),
            "stderr": _lines(self.text["stderr"]),
            "results": self.results,
            "error": error,
            **summary,
        }


def _lines(chunks: list[str]) -> list[str]:
    """Lines ending in "\n" (only), whatever the writes' and reads' chunking was."""
    *whole, rest = "".join(chunks).split("\n")
    return [line + "\n" for line in whole] + ([rest] if rest else [])
