"""Background processes (SPEC §9): start, list, feed stdin, signal, resize, kill, replay.

Each process runs in its own session, on pipes or on a pseudo-terminal; its output goes to a
bounded `OutputLog` that readers replay from an offset and follow live. The table shares the
runner's set of tracked pids, so the orphan reaper never steals a process's exit status and
a kill walk never crosses into another command's tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, Literal, TypedDict

from sandcell.daemon.exec import tree
from sandcell.daemon.exec.runner import DRAIN_GRACE_S, Runner, exit_status, wait_exited
from sandcell.daemon.exec.spawn import spawn_command
from sandcell.daemon.processes import terminal
from sandcell.daemon.processes.outputlog import OutputLog
from sandcell.errors import ErrorCode, ServiceError

MAX_RUNNING = 64
KEEP_EXITED = 64
# The daemon's memory is the cell's: output buffers are bounded in total, not only per process.
RUNNING_BUFFER_BUDGET = 128 * 1_048_576  # the sum of running processes' buffer caps
EXITED_OUTPUT_BUDGET = 32 * 1_048_576  # output kept for exited processes, oldest dropped first
PIPE_STREAMS = ("stdout", "stderr")
PTY_STREAMS = ("pty",)
FIRST_READER_HOLD_S = 5.0
EOF_CHAR = b"\x04"  # a terminal's end of input (VEOF), what Ctrl-D sends


@dataclass(frozen=True)
class Launch:
    """A validated request to start a process (paths and env already built)."""

    command: str | list[str]
    argv: list[str]
    cwd: str
    cwd_shown: str
    env: dict[str, str]
    timeout_s: float
    stdin: bool
    pty: tuple[int, int] | None  # (cols, rows)
    tag: str | None
    buffer_bytes: int


class ExitRecord(TypedDict):
    """How a process ended, as the process API reports it."""

    exit_code: int | None  # None while it runs
    signal: int | None
    timed_out: bool


class ProcessRecord(ExitRecord):
    """A process as the process API lists it (`cellapi.processes.ProcessInfo`'s JSON)."""

    pid: int
    tag: str | None
    command: str | list[str]
    cwd: str
    pty: bool
    started_at: str
    state: Literal["running", "exited"]


# `ProcessTable.list` shadows the builtin inside the class body.
ProcessRecords = list[ProcessRecord]


class _LogReader(asyncio.Protocol):
    """Feeds one output fd into the log; pauses the pipe while a follower lags."""

    def __init__(self, stream: str, owner: Process) -> None:
        self.stream = stream
        self.owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        if self.owner.log.append(self.stream, data):
            self.transport.pause_reading()
            self.owner.log.when_drained(self._resume)

    def _resume(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.stream_closed(self.stream)


KillTree = Callable[[int], None]


class Process:
    def __init__(
        self,
        launch: Launch,
        proc: subprocess.Popen[bytes],
        pty: terminal.Pty | None,
        kill_tree: KillTree,
    ) -> None:
        self.launch = launch
        self._kill_tree = kill_tree
        self.proc = proc
        self.pid = proc.pid
        self.pty = pty
        self.started_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        self.log = OutputLog(self.log_streams, launch.buffer_bytes)
        self.log.hold_for_first_reader(FIRST_READER_HOLD_S)
        self.exit: ExitRecord | None = None
        self.timed_out = False
        self._open_streams = set(self.log_streams)
        self._drained = asyncio.Event()
        self._transports: list[asyncio.BaseTransport] = []
        self._stdin_fd: int | None = _stdin_fd(proc, pty)
        self._stdin_lock = asyncio.Lock()

    @property
    def log_streams(self) -> tuple[str, ...]:
        return PTY_STREAMS if self.pty else PIPE_STREAMS

    def info(self) -> ProcessRecord:
        exit: ExitRecord = self.exit or {"exit_code": None, "signal": None, "timed_out": False}
        return {
            "pid": self.pid,
            "tag": self.launch.tag,
            "command": self.launch.command,
            "cwd": self.launch.cwd_shown,
            "pty": self.pty is not None,
            "started_at": self.started_at,
            "state": "exited" if self.exit else "running",
            **exit,
        }

    async def attach(self) -> None:
        loop = asyncio.get_running_loop()
        sources: dict[str, IO[bytes]]
        if self.pty is not None:
            sources = {"pty": os.fdopen(os.dup(self.pty.master), "rb", buffering=0)}
        else:
            stdout, stderr = self.proc.stdout, self.proc.stderr
            # Without a pty the process is spawned with stdout and stderr on pipes (`_spawn`).
            assert stdout is not None and stderr is not None
            sources = {"stdout": stdout, "stderr": stderr}
        for stream, pipe in sources.items():
            transport, _ = await loop.connect_read_pipe(self._reader_of(stream), pipe)
            self._transports.append(transport)

    def _reader_of(self, stream: str) -> Callable[[], _LogReader]:
        return lambda: _LogReader(stream, self)

    def stream_closed(self, stream: str) -> None:
        self._open_streams.discard(stream)
        if not self._open_streams:
            self._drained.set()

    async def supervise(self, on_exit: Callable[[Process], None]) -> None:
        try:
            await self._wait()
            await self._drain()
        finally:
            for transport in self._transports:
                transport.close()
            self._close_fds()
            self.log.close()
            on_exit(self)

    async def _wait(self) -> None:
        try:
            async with asyncio.timeout(self.launch.timeout_s or None):
                await wait_exited(self.proc)
        except TimeoutError:
            self.timed_out = True
            self.kill()
            await wait_exited(self.proc)
        assert self.proc.returncode is not None
        exit_code, sig = exit_status(self.proc.returncode, self.timed_out)
        self.exit = {"exit_code": exit_code, "signal": sig, "timed_out": self.timed_out}

    async def _drain(self) -> None:
        """Output still in the pipes is kept; a descendant holding them open is not waited
        for beyond a short grace, unless a follower is still catching up (backpressure)."""
        while not self._drained.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DRAIN_GRACE_S):
                    await self._drained.wait()
            if not self.log.over_cap:
                return

    def kill(self) -> None:
        """SIGKILLs the whole tree (not other commands' trees)."""
        if self.proc.returncode is None:
            self._kill_tree(self.pid)

    def send_signal(self, sig: int) -> None:
        if self.exit is not None:
            raise ServiceError(ErrorCode.CONFLICT, f"process {self.pid} has exited")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def resize(self, cols: int, rows: int) -> None:
        if self.pty is None:
            raise ServiceError(ErrorCode.CONFLICT, f"process {self.pid} has no terminal")
        if self.exit is None:
            terminal.resize(self.pty.master, cols, rows)

    async def write_stdin(self, data: bytes) -> None:
        async with self._stdin_lock:
            fd = self._writable_stdin()
            view = memoryview(data)
            try:
                while view:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        await _writable(fd)
            except (BrokenPipeError, OSError) as exc:
                raise ServiceError(
                    ErrorCode.CONFLICT, f"process {self.pid} no longer reads its stdin"
                ) from exc

    async def close_stdin(self) -> None:
        async with self._stdin_lock:
            fd = self._writable_stdin()
            if self.pty is not None:
                with contextlib.suppress(OSError):
                    os.write(fd, EOF_CHAR)
                return
            os.close(fd)
            self._stdin_fd = None
            self.proc.stdin = None  # closed above: Popen must not close it again

    def _writable_stdin(self) -> int:
        if self._stdin_fd is None or (self.pty is not None and self.exit is not None):
            raise ServiceError(ErrorCode.CONFLICT, f"process {self.pid} has no open stdin")
        return self._stdin_fd

    def _close_fds(self) -> None:
        if self.pty is not None:
            os.close(self.pty.master)
            self._stdin_fd = None
        elif self._stdin_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._stdin_fd)
            self._stdin_fd = None
            self.proc.stdin = None


class ProcessTable:
    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._running: dict[int, Process] = {}
        self._exited: OrderedDict[int, Process] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def list(self) -> ProcessRecords:
        return [p.info() for p in (*self._running.values(), *self._exited.values())]

    def get(self, pid: int | str) -> Process:
        """The process `pid` (an int, or as written in a path)."""
        if isinstance(pid, str):
            pid = int(pid) if pid.isascii() and pid.isdigit() else -1
        found = self._running.get(pid) or self._exited.get(pid)
        if found is None:
            raise ServiceError(ErrorCode.NOT_FOUND, f"no process {pid}", {"pid": pid})
        return found

    async def start(self, launch: Launch) -> Process:
        if len(self._running) >= MAX_RUNNING:
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                f"{MAX_RUNNING} processes are already running",
                headers={"Retry-After": "1"},
            )
        self._check_buffer_budget(launch)
        process = _spawn(launch, self._kill_tree)
        self._runner.track(process.pid)
        self._exited.pop(process.pid, None)  # the pid was reused
        self._running[process.pid] = process
        try:
            await process.attach()
        except BaseException:
            process.kill()
            raise
        task = asyncio.ensure_future(process.supervise(self._finished))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return process

    def _check_buffer_budget(self, launch: Launch) -> None:
        streams = len(PTY_STREAMS if launch.pty else PIPE_STREAMS)
        reserved = sum(p.launch.buffer_bytes * len(p.log_streams) for p in self._running.values())
        if reserved + launch.buffer_bytes * streams > RUNNING_BUFFER_BUDGET:
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                "the running processes' output buffers use the whole budget "
                f"({RUNNING_BUFFER_BUDGET} bytes): use a smaller max_buffer_bytes",
                headers={"Retry-After": "1"},
            )

    def _kill_tree(self, pid: int) -> None:
        tree.kill_command_tree(pid, self._runner.running_pids - {pid})

    def _finished(self, process: Process) -> None:
        self._running.pop(process.pid, None)
        self._runner.untrack(process.pid)
        self._exited[process.pid] = process
        while len(self._exited) > KEEP_EXITED:
            self._exited.popitem(last=False)
        kept = sum(p.log.retained for p in self._exited.values())
        for old in self._exited.values():  # oldest first
            if kept <= EXITED_OUTPUT_BUDGET:
                break
            kept -= old.log.retained
            old.log.discard()


def _spawn(launch: Launch, kill_tree: KillTree) -> Process:
    if launch.pty is None:
        proc = _spawn_or_fail(
            launch,
            launch.argv,
            stdin=subprocess.PIPE if launch.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
        return Process(launch, proc, None, kill_tree)
    try:
        pty = terminal.open_pty(*launch.pty)
    except OSError as exc:
        raise ServiceError(
            ErrorCode.OVERLOADED, f"cannot allocate a terminal: {exc.strerror or exc}"
        ) from exc
    try:
        argv = terminal.with_controlling_tty(launch.argv, pty.slave_path)
        proc = _spawn_or_fail(
            launch,
            argv,
            stdin=pty.slave,
            stdout=pty.slave,
            stderr=pty.slave,
            env={**launch.env, "TERM": terminal.TERM},
        )
    except BaseException:
        os.close(pty.master)
        raise
    finally:
        pty.close_slave()
    return Process(launch, proc, pty, kill_tree)


def _spawn_or_fail(launch: Launch, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    kwargs.setdefault("env", launch.env)
    try:
        # A session of its own: signals go to its group, a pty becomes its terminal.
        return spawn_command(argv, cwd=launch.cwd, start_new_session=True, **kwargs)
    except OSError as exc:
        # Unlike exec, there is no result to carry a 127: the start itself fails.
        raise ServiceError(
            ErrorCode.BAD_REQUEST, f"cannot start {argv[0]}: {exc.strerror or exc}"
        ) from exc


def _stdin_fd(proc: subprocess.Popen[bytes], pty: terminal.Pty | None) -> int | None:
    if pty is not None:
        return pty.master
    return proc.stdin.fileno() if proc.stdin is not None else None


def _settle(future: asyncio.Future[None]) -> None:
    """A reader's or writer's callback: the waiting future done, once."""
    if not future.done():
        future.set_result(None)


async def _writable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, _settle, ready)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


def parse_signal(value: str | int) -> int:
    """A signal by number, or by name with or without the SIG prefix (any case)."""
    if isinstance(value, int):
        number = value
    else:
        name = value.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            number = int(signal.Signals[name])
        except KeyError:
            raise ServiceError(ErrorCode.BAD_REQUEST, f"unknown signal {value!r}") from None
    if number not in {int(s) for s in signal.valid_signals()} or number == 0:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"unknown signal {value!r}")
    return number
