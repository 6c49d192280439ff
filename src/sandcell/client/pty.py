"""`sbx.pty`: interactive terminals in a sandbox (SPEC §9), written once for sync and async."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.client.binding import AsyncBound, SyncBound, operation
from sandcell.client.models import ProcessInfo
from sandcell.client.processes import (
    CommandHandleBase,
    process_path,
    send_stdin,
    start_body,
    start_request,
)
from sandcell.client.protocol import Op, Request, call, call_json

if TYPE_CHECKING:
    from sandcell.client.lifecycle import SandboxBase

# A login shell where there is bash, else the POSIX shell; `exec` keeps the pid.
DEFAULT_SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh; fi"

DataCallback = Callable[[bytes], Any]


class PtyHandleBase(CommandHandleBase):
    """A process on a terminal: `send_input`, `resize`, `kill`, `wait`."""

    @operation
    def send_input(self, data: str | bytes) -> Op[None]:
        """Type `data` into the terminal (b"\\x03" is Ctrl-C, b"\\x04" Ctrl-D)."""
        yield from send_stdin(self._transport, self.sandbox_id, self.pid, data)

    @operation
    def resize(self, cols: int, rows: int) -> Op[None]:
        """Change the terminal's size (the process gets SIGWINCH)."""
        request = Request(
            "POST",
            process_path(self.sandbox_id, self.pid, "resize"),
            json={"cols": cols, "rows": rows},
        )
        yield from call(request, self._transport.config.retry)


class PtyHandle(SyncBound, PtyHandleBase):
    __doc__ = PtyHandleBase.__doc__


class AsyncPtyHandle(AsyncBound, PtyHandleBase):
    __doc__ = PtyHandleBase.__doc__


class PtyBase:
    """`sbx.pty`: start processes on a new pseudo-terminal."""

    _handle_class: type[PtyHandleBase]

    def __init__(self, sandbox: SandboxBase) -> None:
        self._sandbox = sandbox
        self._transport = sandbox._transport

    @operation
    def create(
        self,
        cols: int = 80,
        rows: int = 24,
        on_data: DataCallback | None = None,
        cmd: str | Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Op[Any]:
        """Start `cmd` (a login shell by default) on a `cols` x `rows` terminal.

        `on_data` gets the terminal's output bytes as they come; `wait()` returns the exit
        status (with the output, decoded, as `stdout`). `timeout` None: no limit.
        """
        command = DEFAULT_SHELL if cmd is None else cmd
        body = start_body(
            command, timeout=timeout, env=env, cwd=cwd, stdin=None, tag=None, pty=(cols, rows)
        )
        data = yield from call_json(
            start_request(self._sandbox.id, body), self._transport.config.retry
        )
        info = ProcessInfo.from_dict(data)
        handle = self._handle_class(self._sandbox.id, self._transport, info, {"pty": on_data})
        if on_data is not None:
            yield from handle._start_following()
        return handle


class Pty(SyncBound, PtyBase):
    __doc__ = PtyBase.__doc__
    _handle_class = PtyHandle


class AsyncPty(AsyncBound, PtyBase):
    __doc__ = PtyBase.__doc__
    _handle_class = AsyncPtyHandle
