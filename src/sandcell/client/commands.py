"""Running commands in a sandbox (SPEC §2.2): `sbx.commands.run(...)`, written once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.client.binding import AsyncBound, SyncBound, operation
from sandcell.client.errors import CommandExitError
from sandcell.client.lifecycle import sandbox_path
from sandcell.client.models import CommandResult
from sandcell.client.protocol import (
    NDJSON,
    Invoke,
    NdjsonDecoder,
    Op,
    OutputCollector,
    Read,
    Request,
    call,
)

if TYPE_CHECKING:
    from sandcell.client.lifecycle import SandboxBase

MAX_TIMEOUT_S = 86_400
# The router waits the command's timeout plus 30 s for the daemon; we wait a little longer.
READ_MARGIN_S = 45.0

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
        stdin: str | bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
    ) -> Op[CommandResult]:
        """Run `cmd` and wait for it to finish.

        A string runs with `/bin/sh -c`; a list is executed directly. `timeout` (seconds,
        None for the maximum of a day) kills the command's whole process tree; the result then
        has `timed_out` set and exit code 124. `cwd` is relative to the workspace; `env` is
        added to the sandbox's environment; `stdin` is fed to the command (closed otherwise).

        With `on_stdout`/`on_stderr` the output is streamed: each callback gets text chunks
        as the command writes them (not necessarily whole lines); the result still holds all
        of it. Output past `max_output_bytes` per stream (1 MiB by default) is dropped and
        flagged in `stdout_truncated`/`stderr_truncated`. `check=True` raises
        `CommandExitError` (with `.result`) when the exit code is not 0.
        """
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
            result = yield from _follow(reply.stream, {"stdout": on_stdout, "stderr": on_stderr})
        if check and result.exit_code != 0:
            raise CommandExitError(result)
        return result


def _follow(stream: Any, callbacks: Mapping[str, OutputCallback | None]) -> Op[CommandResult]:
    """Reads NDJSON events as they arrive, hands output to the callbacks, keeps it all."""
    decoder, collected = NdjsonDecoder(), OutputCollector()
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


class AsyncCommands(AsyncBound, CommandsBase):
    __doc__ = CommandsBase.__doc__
