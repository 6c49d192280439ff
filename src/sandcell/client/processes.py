"""Background processes (SPEC §9): handles to wait on, feed, signal and kill, written once.

A handle follows its process's output through `GET .../processes/{pid}/output?follow=true`
from the offset it has reached, so a broken connection resumes exactly where it stopped.
With callbacks, a follower runs alongside the caller (a thread, or an asyncio task) from
the start; `wait()` then joins it.
"""

from __future__ import annotations

import base64
import codecs
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sandcell.client.binding import AsyncBound, SyncBound, operation
from sandcell.client.config import ClientConfig
from sandcell.client.errors import ConnectionFailedError, SandboxUnreachableError
from sandcell.client.lifecycle import sandbox_path
from sandcell.client.models import CommandResult, ProcessInfo
from sandcell.client.protocol import (
    Invoke,
    Join,
    NdjsonDecoder,
    Op,
    OutputCollector,
    Read,
    Request,
    Sleep,
    Spawn,
    call,
    call_deleted,
)

# Following a process may stay quiet for as long as it runs: no practical read timeout.
FOLLOW_READ_TIMEOUT_S = 30 * 86_400.0
MAX_RECONNECTS = 5

Callback = Callable[[Any], Any]


def start_body(
    cmd: str | Sequence[str],
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: str | bytes | bool | None,
    tag: str | None,
    pty: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The `POST .../processes` body (a `stdin` given as text or bytes opens stdin)."""
    body: dict[str, Any] = {
        "command": cmd if isinstance(cmd, str) else [str(a) for a in cmd],
        "timeout_s": timeout or 0,
        "stdin": stdin is not None and stdin is not False,
    }
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = str(cwd)
    if tag is not None:
        body["tag"] = tag
    if pty is not None:
        body["pty"] = {"cols": pty[0], "rows": pty[1]}
    return body


def start_request(sandbox_id: str, body: dict[str, Any]) -> Request:
    # Not idempotent: a process that may have started is never started again.
    return Request("POST", process_path(sandbox_id), json=body, idempotent=False)


def process_path(sandbox_id: str, pid: int | None = None, rest: str = "") -> str:
    tail = "processes" if pid is None else f"processes/{pid}"
    return sandbox_path(sandbox_id, f"{tail}/{rest}" if rest else tail)


class _Output:
    """Turns a process's output events into callback calls and the text a result keeps."""

    def __init__(self, callbacks: Mapping[str, Callback | None]) -> None:
        self.callbacks = callbacks
        self.offset = 0
        self.kept = OutputCollector()
        self.exited = False
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace")
            for name in ("stdout", "stderr", "pty")
        }

    def add(self, event: Mapping[str, Any]) -> list[tuple[Callback, Any]]:
        """Records an event; returns the callback calls it makes."""
        kind = event.get("type")
        if kind == "exit":
            self.kept.add(event)
            self.exited = True
            return []
        if kind not in self._decoders or "data_b64" not in event:
            return []  # "lost" and newer event types: nothing to keep
        data = base64.b64decode(str(event["data_b64"]))
        self.offset = int(event.get("offset", self.offset)) + len(data)
        text = self._decoders[kind].decode(data)
        self.kept.keep("stdout" if kind == "pty" else kind, text)
        if (callback := self.callbacks.get(kind)) is not None:
            return [(callback, data if kind == "pty" else text)] if data else []
        if kind == "pty" and (callback := self.callbacks.get("stdout")) is not None:
            return [(callback, text)] if text else []  # a terminal's output, as text
        return []


class CommandHandleBase:
    """A process started with `commands.run(..., background=True)` or found by `connect`."""

    def __init__(
        self,
        sandbox_id: str,
        transport: Any,
        info: ProcessInfo,
        callbacks: Mapping[str, Callback | None],
    ) -> None:
        self.sandbox_id = sandbox_id
        self._transport = transport
        self.info = info
        self._output = _Output(callbacks)
        self._job: Any = None

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self.pid} {self.info.command!r}>"

    def attach_target(self) -> tuple[str, dict[str, str]]:
        """The WebSocket URL and headers of an interactive attach (SPEC §9)."""
        return attach_target(self._transport.config, self.sandbox_id, self.pid)

    def _start_following(self) -> Op[None]:
        self._job = yield Spawn(self._follow())

    @operation
    def wait(self) -> Op[CommandResult]:
        """Wait for the process to exit; its result (output kept up to 1 MiB a stream)."""
        if self._job is not None:
            return (yield Join(self._job))
        return (yield from self._follow())

    def _follow(self) -> Op[CommandResult]:
        failures = 0
        while True:
            offset = self._output.offset
            try:
                yield from self._read_output(self._output)
            except (ConnectionFailedError, SandboxUnreachableError):
                failures += 1
                if failures > MAX_RECONNECTS:
                    raise
                yield Sleep(min(0.1 * 2**failures, 2.0))
            if self._output.exited:
                return self._output.kept.result()
            if self._output.offset > offset:
                failures = 0

    @operation
    def replay(
        self, on_stdout: Callback | None = None, on_stderr: Callback | None = None
    ) -> Op[None]:
        """Hand the output buffered so far (the last 1 MiB of each stream) to these
        callbacks, without waiting for more (a terminal's output goes to `on_stdout`)."""
        once = _Output({"stdout": on_stdout, "stderr": on_stderr})
        yield from self._read_output(once, follow=False)

    def _read_output(self, output: _Output, follow: bool = True) -> Op[None]:
        params = {"follow": str(follow).lower(), "offset": str(output.offset)}
        request = Request(
            "GET",
            process_path(self.sandbox_id, self.pid, "output"),
            params=params,
            timeout=FOLLOW_READ_TIMEOUT_S,
            stream=True,
        )
        reply = yield from call(request, self._transport.config.retry)
        decoder = NdjsonDecoder()
        while True:
            chunk = yield Read(reply.stream)
            for event in decoder.feed(chunk) if chunk else decoder.close():
                for callback, value in output.add(event):
                    yield Invoke(callback, (value,))
            if not chunk:
                return

    @operation
    def send_stdin(self, data: str | bytes) -> Op[None]:
        """Write to the process's stdin (its terminal for a pty); ConflictError if closed."""
        yield from send_stdin(self._transport, self.sandbox_id, self.pid, data)

    @operation
    def close_stdin(self) -> Op[None]:
        """Close stdin: the process reads end-of-file (Ctrl-D on a terminal)."""
        yield from close_stdin(self._transport, self.sandbox_id, self.pid)

    @operation
    def signal(self, sig: str | int) -> Op[None]:
        """Send a signal ("SIGINT", "INT" or 2) to the process's group."""
        request = Request(
            "POST", process_path(self.sandbox_id, self.pid, "signal"), json={"signal": sig}
        )
        yield from call(request, self._transport.config.retry)

    @operation
    def kill(self) -> Op[bool]:
        """SIGKILL the process and all its descendants; False if it is unknown."""
        return (yield from kill(self._transport, self.sandbox_id, self.pid))


def send_stdin(transport: Any, sandbox_id: str, pid: int, data: str | bytes) -> Op[None]:
    content = data.encode() if isinstance(data, str) else bytes(data)
    request = Request(
        "POST",
        process_path(sandbox_id, pid, "stdin"),
        content=content,
        headers={"content-type": "application/octet-stream"},
        idempotent=False,  # bytes written twice would be read twice
    )
    yield from call(request, transport.config.retry)


def attach_target(config: ClientConfig, sandbox_id: str, pid: int) -> tuple[str, dict[str, str]]:
    """The WebSocket URL and headers that attach to a process (`.../processes/{pid}/ws`)."""
    scheme, sep, rest = config.url.rstrip("/").partition("://")
    ws_scheme = "wss" if scheme == "https" else "ws"
    return f"{ws_scheme}{sep}{rest}{process_path(sandbox_id, pid, 'ws')}", config.headers()


def close_stdin(transport: Any, sandbox_id: str, pid: int) -> Op[None]:
    request = Request("POST", process_path(sandbox_id, pid, "stdin/close"))
    yield from call(request, transport.config.retry)


def kill(transport: Any, sandbox_id: str, pid: int) -> Op[bool]:
    request = Request("DELETE", process_path(sandbox_id, pid))
    return (yield from call_deleted(request, transport.config.retry))


class CommandHandle(SyncBound, CommandHandleBase):
    __doc__ = CommandHandleBase.__doc__


class AsyncCommandHandle(AsyncBound, CommandHandleBase):
    __doc__ = CommandHandleBase.__doc__
