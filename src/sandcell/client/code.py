"""The code interpreter (SPEC §10) with e2b-code-interpreter's names, written once.

```python
with Sandbox.create() as sbx:
    sbx.run_code("x = 1")
    execution = sbx.run_code("x + 1")          # state persists between runs
    execution.text                             # '2': the main result's plain text
    chart = sbx.run_code("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()")
    chart.results[0].png                       # base64 PNG
```
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sandcell.cellapi.limits import ANSWER_MARGIN_S, CLIENT_MARGIN_S
from sandcell.client.binding import operation
from sandcell.client.config import RetryPolicy
from sandcell.client.errors import InvalidResponseError, SandboxUnreachableError
from sandcell.client.lifecycle import sandbox_path
from sandcell.client.models import list_in
from sandcell.client.protocol import NDJSON, Invoke, NdjsonDecoder, Op, Read, Request, call

DEFAULT_TIMEOUT_S = 300.0
# The router waits a run's timeout plus 30 s; we wait a little longer (a start included).
READ_MARGIN_S = ANSWER_MARGIN_S + CLIENT_MARGIN_S  # past the router's own timeout

# Result attribute -> MIME type, as e2b-code-interpreter names them.
FORMATS = {
    "text": "text/plain",
    "html": "text/html",
    "markdown": "text/markdown",
    "svg": "image/svg+xml",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "pdf": "application/pdf",
    "latex": "text/latex",
    "json": "application/json",
    "javascript": "application/javascript",
}


class OutputMessage(str):
    """A piece of stdout or stderr, as handed to `on_stdout`/`on_stderr` (a `str`, with
    e2b's `.line`, `.error` and `.timestamp`)."""

    error: bool
    timestamp: int

    def __new__(cls, line: str, error: bool = False) -> OutputMessage:
        message = super().__new__(cls, line)
        message.error = error
        message.timestamp = time.time_ns() // 1000
        return message

    @property
    def line(self) -> str:
        return str(self)


@dataclass(frozen=True)
class Result:
    """One rich output: the main result (the last expression's value) or a display.

    `png` and `jpeg` are base64 text (`image_bytes()` decodes them); `json` is the JSON value.
    """

    is_main_result: bool = False
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> Result:
        if not isinstance(data, Mapping):
            raise InvalidResponseError(f"not a result: {data!r:.200}")
        known = {name: data[mime] for name, mime in FORMATS.items() if mime in data}
        mimes = {*FORMATS.values(), "is_main_result", "type"}
        extra = {k: v for k, v in data.items() if k not in mimes}
        return cls(is_main_result=bool(data.get("is_main_result")), extra=extra, **known)

    def formats(self) -> list[str]:
        """The formats this result has, e.g. ['text', 'html']."""
        present = [name for name in FORMATS if getattr(self, name) is not None]
        return present + list(self.extra)

    def image_bytes(self) -> bytes | None:
        """The PNG or JPEG image, decoded."""
        image = self.png or self.jpeg
        return base64.b64decode(image) if image else None

    def to_dict(self) -> dict[str, Any]:
        data = {mime: getattr(self, name) for name, mime in FORMATS.items()}
        bundle = {mime: value for mime, value in data.items() if value is not None}
        return {"is_main_result": self.is_main_result, **bundle, **self.extra}

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def _repr_html_(self) -> str | None:
        return self.html

    def _repr_png_(self) -> str | None:
        return self.png


@dataclass
class Logs:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExecutionError:
    """The code raised: `name` ('ZeroDivisionError'), `value` ('division by zero'), and the
    traceback as text. The request itself succeeded."""

    name: str
    value: str
    traceback: str

    @classmethod
    def from_dict(cls, data: Any) -> ExecutionError:
        if not isinstance(data, Mapping):
            raise InvalidResponseError(f"not an error: {data!r:.200}")
        return cls(
            str(data.get("name", "")), str(data.get("value", "")), str(data.get("traceback", ""))
        )


@dataclass
class Execution:
    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    truncated: bool = False  # output or results past the caps were dropped

    @property
    def text(self) -> str | None:
        """The main result's plain text (None when the code ended without a value)."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @classmethod
    def from_dict(cls, data: Any) -> Execution:
        if not isinstance(data, Mapping) or "results" not in data:
            raise InvalidResponseError(f"not an execution: {data!r:.200}")
        execution = cls(
            results=[Result.from_dict(r) for r in data.get("results") or []],
            logs=Logs(list(data.get("stdout") or []), list(data.get("stderr") or [])),
            error=ExecutionError.from_dict(data["error"]) if data.get("error") else None,
        )
        execution._finish(data)
        return execution

    def _finish(self, summary: Mapping[str, Any]) -> None:
        count = summary.get("execution_count")
        self.execution_count = count if isinstance(count, int) else None
        self.duration_s = float(summary.get("duration_s") or 0.0)
        self.timed_out = bool(summary.get("timed_out"))
        flags = ("stdout_truncated", "stderr_truncated", "results_truncated")
        self.truncated = any(summary.get(f) for f in flags)

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [r.to_dict() for r in self.results],
            "stdout": self.logs.stdout,
            "stderr": self.logs.stderr,
            "error": None if self.error is None else vars(self.error),
            "execution_count": self.execution_count,
            "duration_s": self.duration_s,
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class Context:
    """A stateful interpreter in the sandbox: its variables, imports and working directory."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_dict(cls, data: Any) -> Context:
        if not isinstance(data, Mapping) or "id" not in data:
            raise InvalidResponseError(f"not a code context: {data!r:.200}")
        return cls(str(data["id"]), str(data.get("language", "")), str(data.get("cwd", "")))


Callback = Callable[[Any], Any]


class _Events:
    """Streamed run events into an Execution, handing each to its callback on the way."""

    def __init__(self, callbacks: Mapping[str, Callback | None]) -> None:
        self.execution = Execution()
        self.callbacks = callbacks
        self.ended = False

    def take(self, event: Mapping[str, Any]) -> Iterator[tuple[Callback, Any]]:
        kind = event.get("type")
        if kind in ("stdout", "stderr"):
            message = OutputMessage(str(event.get("text", "")), error=kind == "stderr")
            getattr(self.execution.logs, kind).append(message.line)
            payload: Any = message
        elif kind == "result":
            payload = Result.from_dict(event)
            self.execution.results.append(payload)
        elif kind == "error":
            payload = self.execution.error = ExecutionError.from_dict(event)
        elif kind == "end":
            self.execution._finish(event)
            logs = self.execution.logs  # lines, as in a buffered reply, whatever the chunks
            logs.stdout, logs.stderr = _lines(logs.stdout), _lines(logs.stderr)
            self.ended = True
            return
        else:
            return  # newer servers may add event types
        if (callback := self.callbacks.get(kind)) is not None:
            yield callback, payload


def _lines(chunks: list[str]) -> list[str]:
    *whole, rest = "".join(chunks).split("\n")
    return [line + "\n" for line in whole] + ([rest] if rest else [])


def _context_path(sandbox_id: str, context: Context | str, rest: str = "") -> str:
    context_id = context.id if isinstance(context, Context) else str(context)
    return sandbox_path(sandbox_id, f"code/contexts/{quote(context_id, safe='')}{rest}")


class CodeInterpreter:
    """`run_code` and code contexts, mixed into `Sandbox` and `AsyncSandbox`."""

    id: str
    _policy: RetryPolicy

    @operation
    def run_code(
        self,
        code: str,
        language: str | None = None,
        context: Context | str | None = None,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        on_result: Callback | None = None,
        on_error: Callback | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
    ) -> Op[Execution]:
        """Run `code` in a context (the language's default context, python unless said).

        State persists between runs of a context. The value of the last expression is the
        main result (`execution.text`); `display(...)` and matplotlib figures add results.
        An exception in the code is `execution.error`, not a raised error. `timeout`
        (seconds) interrupts the run and keeps the context's state. With callbacks the run
        is streamed: `on_stdout`/`on_stderr` get `OutputMessage`s as the code prints,
        `on_result` each `Result`, `on_error` the `ExecutionError`.
        """
        body: dict[str, Any] = {"code": code}
        if context is not None:
            body["context_id"] = context.id if isinstance(context, Context) else str(context)
        if language is not None:
            body["language"] = language
        if envs:
            body["env"] = dict(envs)
        timeout_s = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
        body["timeout_s"] = timeout_s
        callbacks = {
            "stdout": on_stdout,
            "stderr": on_stderr,
            "result": on_result,
            "error": on_error,
        }
        streaming = any(callbacks.values())
        request = Request(
            "POST",
            sandbox_path(self.id, "code/run"),
            json=body,
            headers={"accept": NDJSON} if streaming else None,
            timeout=timeout_s + READ_MARGIN_S,
            stream=streaming,
            idempotent=False,  # code that may have run is never run twice
        )
        reply = yield from call(request, self._policy)
        if not streaming:
            return Execution.from_dict(reply.json())
        return (yield from _follow(reply.stream, _Events(callbacks)))

    @operation
    def create_code_context(
        self, language: str | None = None, cwd: str | None = None
    ) -> Op[Context]:
        """A new context in `cwd` (relative to the workspace); its interpreter starts with the
        first run."""
        body = {"language": language or "python", "cwd": cwd or "."}
        request = Request(
            "POST", sandbox_path(self.id, "code/contexts"), json=body, idempotent=False
        )
        reply = yield from call(request, self._policy)
        return Context.from_dict(reply.json())

    @operation
    def list_code_contexts(self) -> Op[list[Context]]:
        reply = yield from call(
            Request("GET", sandbox_path(self.id, "code/contexts")), self._policy
        )
        data = reply.json()
        return [Context.from_dict(c) for c in list_in(data, "contexts")]

    @operation
    def restart_code_context(self, context: Context | str) -> Op[None]:
        """Fresh state: the context's interpreter is replaced (a run in it is stopped)."""
        path = _context_path(self.id, context, "/restart")
        yield from call(Request("POST", path, content=b""), self._policy)

    @operation
    def remove_code_context(self, context: Context | str) -> Op[None]:
        path = _context_path(self.id, context)
        yield from call(Request("DELETE", path), self._policy)


def _follow(stream: Any, events: _Events) -> Op[Execution]:
    decoder = NdjsonDecoder()
    while True:
        chunk = yield Read(stream)
        for event in decoder.feed(chunk) if chunk else decoder.close():
            for callback, payload in events.take(event):
                yield Invoke(callback, (payload,))
        if not chunk:
            if not events.ended:
                raise SandboxUnreachableError("the run's stream ended before its end event")
            return events.execution
