"""A context's process as the daemon sees it: four pipes and a pidfd, whatever the language.

The process gets stdin from /dev/null, stdout and stderr on two pipes, requests on a third
(framed by the language) and sends JSON-line events on a fourth. All are read in the event
loop, without threads. Before an event is handled, whatever is already in the output pipes is
read first: output written before a result or the end of a run is reported before it.

The process is started by the daemon under the cell's confinement (`spawn_command`), in its
own session, so an interrupt reaches the whole group and a kill takes the whole tree. Its
pid is tracked beside exec's commands: the orphan reaper leaves its exit status to us, and an
exec timeout's kill walk never mistakes it for an orphan of the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sandcell.daemon.code.results import MAX_RESULT_BYTES, Event, RunOutput, error_event
from sandcell.daemon.exec import tree
from sandcell.daemon.exec.spawn import spawn_command

READ_CHUNK = 65_536
MAX_EVENT_LINE = MAX_RESULT_BYTES + READ_CHUNK
STDERR_TAIL = 4096
CHANNEL_GRACE_S = 1.0


class KernelDied(Exception):
    """The process ended (os._exit, a signal, the OOM killer) or stopped talking."""


class Tracker(Protocol):
    """The daemon's table of processes it started (see `Runner`)."""

    @property
    def running_pids(self) -> set[int]: ...

    def track(self, pid: int) -> None: ...

    def untrack(self, pid: int) -> None: ...


class Language(Protocol):
    """What differs between languages: the program, its env defaults, the request framing."""

    name: str

    def check(self) -> None:
        """Refuses (a ServiceError) a language this sandbox cannot run, before a context."""
        ...

    def argv(self, command_fd: int, event_fd: int) -> list[str]: ...

    def env_defaults(self) -> dict[str, str]: ...

    def frame(self, run_id: int, code: str, env: Mapping[str, str]) -> bytes: ...

    def finish(self, done: Event, output: RunOutput) -> int | None:
        """Reads a `done` event: the execution count (and records a failure, if any)."""
        ...

    def start_failure(self, stderr_tail: str) -> str: ...


class Kernel:
    def __init__(self, proc: subprocess.Popen[bytes], fds: dict[str, int], tracker: Tracker):
        self.proc = proc
        self._fds = fds
        self._tracker = tracker
        self._events = bytearray()
        self._skipping = False  # inside an over-long event line: dropped up to its newline
        self._stderr_tail = bytearray()
        self._run: tuple[int, RunOutput, asyncio.Future[Event]] | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.dead = False
        self.why_dead = ""
        self._pidfd = os.pidfd_open(proc.pid)
        loop = asyncio.get_running_loop()
        loop.add_reader(fds["events"], self._read_events)
        loop.add_reader(fds["stdout"], self._read_output, "stdout")
        loop.add_reader(fds["stderr"], self._read_output, "stderr")
        loop.add_reader(self._pidfd, self._exited)

    @classmethod
    def spawn(cls, language: Language, cwd: str, env: dict[str, str], tracker: Tracker) -> Kernel:
        command_r, command_w = _pipe()
        event_r, event_w = _pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child_ends = (command_r, event_w, out_w, err_w)
        try:
            proc = spawn_command(
                language.argv(command_r, event_w),
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(command_r, event_w),
                cwd=cwd,
                env={**language.env_defaults(), **env},
                start_new_session=True,  # its own group: interrupted and killed as a tree
            )
        except OSError:
            for fd in (*child_ends, command_w, event_r, out_r, err_r):
                os.close(fd)
            raise
        for fd in child_ends:
            os.close(fd)
        tracker.track(proc.pid)
        for fd in (command_w, event_r, out_r, err_r):
            os.set_blocking(fd, False)
        fds = {"command": command_w, "events": event_r, "stdout": out_r, "stderr": err_r}
        return cls(proc, fds, tracker)

    @property
    def stderr_tail(self) -> str:
        return self._stderr_tail.decode("utf-8", "replace").strip()

    async def submit(self, run_id: int, frame: bytes, output: RunOutput) -> Event:
        """Sends one request; resolves with its `done` event (KernelDied if the process ends)."""
        if self.dead:
            raise KernelDied
        done: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._run = (run_id, output, done)
        try:
            await self._write(frame)
            return await asyncio.shield(done)
        finally:
            self._run = None

    async def _write(self, frame: bytes) -> None:
        """The request, without blocking the loop on a full pipe (a busy kernel reads late)."""
        view = memoryview(frame)
        while view:
            if self.dead:
                raise KernelDied(self.why_dead)
            try:
                view = view[os.write(self._fds["command"], view) :]
            except BlockingIOError:
                await _writable(self._fds["command"], 1.0)
            except BrokenPipeError:
                raise KernelDied("it closed its request channel") from None

    def interrupt(self) -> None:
        """SIGINT to the process group, as a terminal's Ctrl-C: KeyboardInterrupt in Python."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGINT)

    def kill(self) -> None:
        """Kills the whole tree, even when the process itself has already ended (what it
        started lives on in its group), and releases everything. Safe to call twice."""
        if self._pidfd < 0:
            return
        others = self._tracker.running_pids - {self.proc.pid}
        tree.kill_command_tree(self.proc.pid, others, adopted=False)
        self.proc.wait()
        self._mark_dead()
        loop = asyncio.get_running_loop()
        for fd in (*self._fds.values(), self._pidfd):
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}
        self._pidfd = -1
        self._tracker.untrack(self.proc.pid)

    # -- reading -------------------------------------------------------------------------

    def _drain(
        self, name: str, on_data: Callable[[bytes], None], on_end: Callable[[], None]
    ) -> None:
        """Reads what the (non-blocking) pipe `name` holds now; at its end, stops watching."""
        fd = self._fds.get(name)
        while fd is not None:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            if not data:
                asyncio.get_running_loop().remove_reader(fd)
                on_end()
                return
            on_data(data)

    def _read_output(self, stream: str) -> None:
        self._drain(
            stream,
            lambda data: self._deliver_output(stream, data),
            lambda: self._deliver_output(stream, b"", final=True),
        )

    def _deliver_output(self, stream: str, data: bytes, final: bool = False) -> None:
        if self._run is not None:
            self._run[1].output(stream, data, final)
        elif stream == "stderr":  # kept for the message when the process fails to start
            self._stderr_tail = (self._stderr_tail + data)[-STDERR_TAIL:]

    def _read_events(self) -> None:
        self._drain("events", self._take_lines, self._channel_closed)

    def _channel_closed(self) -> None:
        """Usually the process is exiting, and its pidfd tells how. If it lives on without
        its channel, it is of no more use."""
        loop = asyncio.get_running_loop()
        loop.call_later(CHANNEL_GRACE_S, self._lost, "it closed its event channel")

    def _take_lines(self, data: bytes) -> None:
        while data:
            end = data.find(b"\n")
            piece, data = (data, b"") if end < 0 else (data[:end], data[end + 1 :])
            if not self._skipping:
                self._events += piece
            if len(self._events) > MAX_EVENT_LINE:
                self._events.clear()
                self._skipping = True
                if self._run is not None:
                    self._run[1].results_truncated = True
            if end >= 0:
                line, self._skipping = bytes(self._events), False
                self._events.clear()
                if line:
                    self._handle(line)

    def _handle(self, line: bytes) -> None:
        self._read_output("stdout")
        self._read_output("stderr")
        event = _parse(line)
        if event is None:
            return
        if event.get("type") == "ready" and not self.ready.done():
            self.ready.set_result(None)
            return
        if self._run is None or event.get("id") != self._run[0]:
            return  # a late event of an interrupted or abandoned run
        _, output, done = self._run
        kind = event.get("type")
        if kind == "result":
            output.result(event.get("data"), bool(event.get("is_main_result")))
        elif kind == "error":
            output.fail(error_event(event.get("name"), event.get("value"), event.get("traceback")))
        elif kind == "done" and not done.done():
            done.set_result(event)

    def _exited(self) -> None:
        self._read_events()  # what it said before it went
        self.proc.poll()
        self._lost(_status(self.proc.returncode))

    def _lost(self, why: str) -> None:
        if self.dead:
            return
        self._read_output("stdout")
        self._read_output("stderr")
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
        self._mark_dead(why)

    def _mark_dead(self, why: str = "it was stopped") -> None:
        if self.dead:
            return
        self.dead, self.why_dead = True, why
        error = KernelDied(why)
        if not self.ready.done():
            self.ready.set_exception(error)
        if self._run is not None and not self._run[2].done():
            self._run[2].set_exception(error)


def _pipe() -> tuple[int, int]:
    """A pipe whose ends are numbered 10 and up: the bash driver moves its ends to 3 and 4,
    which must not be one of them."""
    r, w = os.pipe()
    try:
        return fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(r)
        os.close(w)


def _settle(future: asyncio.Future[None]) -> None:
    """A reader's or writer's callback: the waiting future done, once."""
    if not future.done():
        future.set_result(None)


async def _writable(fd: int, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, _settle, ready)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready, timeout_s)
    finally:
        loop.remove_writer(fd)


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


def _status(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"it was killed by {name}"
    return f"it exited with code {code}"
