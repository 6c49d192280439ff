"""Running commands in a sandbox (SPEC §2.2): `sbx.commands.run(...)`, written once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.cellapi.limits import ANSWER_MARGIN_S, CLIENT_MARGIN_S, MAX_TIMEOUT_S
from sandcell.client.binding import AsyncBound, SyncBound, operation
from sandcell.client.config import RetryPolicy
from sandcell.client.errors import CommandExitError
from sandcell.client.lifecycle import sandbox_path
from sandcell.client.models import CommandResult, ProcessInfo, list_in
from sandcell.client.processes import (
    AsyncCommandHandle,
    CommandHandle,
    CommandHandleBase,
    close_stdin,
    kill,
    process_path,
    send_stdin,
    start_body,
    start_request,
)
from sandcell.client.protocol import (
    NDJSON,
    Invoke,
    NdjsonDecoder,
    Op,
    OutputCollector,
    Read,
    Request,
    call,
    call_json,
)

if TYPE_CHECKING:
    from sandcell.client.lifecycle import SandboxBase

# The router waits the command's timeout plus its margin for the daemon; we wait longer.
READ_MARGIN_S = ANSWER_MARGIN_S + CLIENT_MARGIN_S

OutputCallback = Callable[[str], Any]


def exec_request(
    sandbox_id: str,
    cmd: str | Sequence[str],
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: str | bytes | None,
    max_output_bytes: int | None,
    stream: bool,
) -> Request:
    """The exec call. A string runs with `/bin/sh -c`; a sequence is executed as argv."""
    command: str | list[str] = cmd if isinstance(cmd, str) else [str(a) for a in cmd]
    timeout_s = MAX_TIMEOUT_S if timeout is None else timeout
    body: dict[str, Any] = {"command": command, "timeout_s": timeout_s}
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = str(cwd)
    if stdin is not None:
        body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    return Request(
        "POST",
        sandbox_path(sandbox_id, "exec"),
        json=body,
        headers={"accept": NDJSON} if stream else None,
        timeout=float(timeout_s) + READ_MARGIN_S if isinstance(timeout_s, int | float) else None,
        stream=stream,
        idempotent=False,  # a command that may have started is never started again
    )


class CommandsBase:
    """`sbx.commands`: run commands in the sandbox's workspace."""

    _handle_class: type[CommandHandleBase]

    def __init__(self, sandbox: SandboxBase) -> None:
        self._sandbox = sandbox
        self._transport = sandbox._transport

    @operation
    def run(
        self,
        cmd: str | Sequence[str],
        timeout: float | None = 60,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | bytes | bool | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
        background: bool = False,
        tag: str | None = None,
    ) -> Op[Any]:
        """Run `cmd` and wait for it to finish (or, with `background=True`, return a handle).

        A string runs with `/bin/sh -c`; a list is executed directly. `timeout` (seconds,
        None for the maximum of a day) kills the command's whole process tree; the result then
        has `timed_out` set and exit code 124. `cwd` is relative to the workspace; `env` is
        added to the sandbox's environment; `stdin` is fed to the command (closed otherwise).

        With `on_stdout`/`on_stderr` the output is streamed: each callback gets text chunks
        as the command writes them (not necessarily whole lines), every byte of it. The
        result keeps `max_output_bytes` per stream (1 MiB by default); more is dropped from
        it and flagged in `stdout_truncated`/`stderr_truncated`. `check=True` raises
        `CommandExitError` (with `.result`) when the exit code is not 0.

        `background=True` starts the command and returns a `CommandHandle` at once (`pid`,
        `wait()`, `kill()`, `send_stdin()`, `close_stdin()`, `signal()`); `stdin=True` keeps
        its stdin open; `timeout` bounds it too (None or 0: as long as the sandbox lives);
        the callbacks get its output as it comes (every byte, however much); `tag` labels it.
        """
        if background:
            body = start_body(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin, tag=tag)
            callbacks = {"stdout": on_stdout, "stderr": on_stderr}
            handle = yield from self._start(body, callbacks)
            if isinstance(stdin, str | bytes):
                yield from send_stdin(self._transport, self._sandbox.id, handle.pid, stdin)
                yield from close_stdin(self._transport, self._sandbox.id, handle.pid)
            return handle
        if isinstance(stdin, bool):
            raise TypeError("stdin=True keeps stdin open: it needs background=True")
        streaming = on_stdout is not None or on_stderr is not None
        request = exec_request(
            self._sandbox.id,
            cmd,
            timeout=timeout,
            env=env,
            cwd=cwd,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            stream=streaming,
        )
        reply = yield from call(request, self._transport.config.retry)
        if not streaming:
            result = CommandResult.from_dict(reply.json())
        else:
            callbacks = {"stdout": on_stdout, "stderr": on_stderr}
            result = yield from _follow(reply.stream, callbacks, max_output_bytes)
        if check and result.exit_code != 0:
            raise CommandExitError(result)
        return result

    def _start(self, body: dict[str, Any], callbacks: Mapping[str, Any]) -> Op[CommandHandleBase]:
        data = yield from call_json(start_request(self._sandbox.id, body), self._policy)
        return (yield from self._handle(ProcessInfo.from_dict(data), callbacks))

    def _handle(self, info: ProcessInfo, callbacks: Mapping[str, Any]) -> Op[CommandHandleBase]:
        handle = self._handle_class(self._sandbox.id, self._transport, info, callbacks)
        if any(callbacks.values()):
            yield from handle._start_following()
        return handle

    @operation
    def list(self) -> Op[list[ProcessInfo]]:
        """Running background processes and the last 64 that exited."""
        data = yield from call_json(Request("GET", process_path(self._sandbox.id)), self._policy)
        return [ProcessInfo.from_dict(x) for x in list_in(data, "processes")]

    @operation
    def connect(
        self,
        pid: int,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> Op[Any]:
        """A handle to a background process; the callbacks get its output from the oldest
        byte still buffered (the last 1 MiB of each stream), then live."""
        data = yield from call_json(
            Request("GET", process_path(self._sandbox.id, pid)), self._policy
        )
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        return (yield from self._handle(ProcessInfo.from_dict(data), callbacks))

    @operation
    def kill(self, pid: int) -> Op[bool]:
        """SIGKILL a background process and its descendants; False if the pid is unknown."""
        return (yield from kill(self._transport, self._sandbox.id, pid))

    @operation
    def send_stdin(self, pid: int, data: str | bytes) -> Op[None]:
        """Write to a background process's stdin."""
        yield from send_stdin(self._transport, self._sandbox.id, pid, data)

    @property
    def _policy(self) -> RetryPolicy:
        return self._transport.config.retry


def _follow(
    stream: Any, callbacks: Mapping[str, OutputCallback | None], cap: int | None
) -> Op[CommandResult]:
    """Reads NDJSON events as they arrive, hands output to the callbacks, keeps it all."""
    decoder, collected = NdjsonDecoder(), OutputCollector(cap)
    while True:
        chunk = yield Read(stream)
        for event in decoder.feed(chunk) if chunk else decoder.close():
            output = collected.add(event)
            if output is not None and (callback := callbacks.get(output[0])) is not None:
                yield Invoke(callback, (output[1],))
        if not chunk:
            return collected.result()


class Commands(SyncBound, CommandsBase):
    __doc__ = CommandsBase.__doc__
    _handle_class = CommandHandle


class AsyncCommands(AsyncBound, CommandsBase):
    __doc__ = CommandsBase.__doc__
    _handle_class = AsyncCommandHandle
