"""Runs one command: spawn, feed stdin, collect capped output, enforce the timeout."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import json
import os
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sandcell.daemon.exec import tree
from sandcell.daemon.exec.pipes import PipeReader
from sandcell.daemon.exec.spawn import spawn_command
from sandcell.daemon.http.steps import step

DRAIN_GRACE_S = 0.1
STREAMS = {1: "stdout", 2: "stderr"}

STREAM_HIGH_WATER = 256 * 1024
# Streamed output events hold at most this many characters. Bigger ones cost more than they
# save: at 128 KiB and above glibc maps fresh memory for every buffer (the daemon's encoding,
# the SDK's decoding), and its page faults made 1 MiB events ~3x slower to decode.
MAX_EVENT_CHARS = 65_536
# Returns True when the consumer is behind and the pipes should pause.
OutputSink = Callable[[str, str], bool | None]


@dataclass
class CommandSpec:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    timeout_s: float
    stdin: bytes | None
    max_output_bytes: int


@dataclass
class CappedOutput:
    """Keeps the head of a stream up to `cap` bytes; later bytes are dropped and flagged."""

    cap: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def add(self, data: bytes) -> bytes:
        """Stores what fits and returns it (the part that may be streamed)."""
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data:  # past the cap a flood would otherwise pile up empty chunks
            self.chunks.append(data)
            self.size += len(data)
        return data


@dataclass
class CommandResult:
    exit_code: int
    stdout: CappedOutput
    stderr: CappedOutput
    timed_out: bool
    signal: int | None
    duration_s: float

    def summary(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "stdout_truncated": self.stdout.truncated,
            "stderr_truncated": self.stderr.truncated,
            "timed_out": self.timed_out,
            "signal": self.signal,
            "duration_s": round(self.duration_s, 6),
        }

    def iter_json(self) -> Iterator[bytes]:
        """The result as JSON (stdout, stderr, then the summary), encoded piece by piece:
        output of up to max_output_bytes per stream is never copied whole (as text, as JSON,
        as bytes), which took ~4x the cap and could get the daemon OOM-killed."""
        yield b"{"
        for name, out in (("stdout", self.stdout), ("stderr", self.stderr)):
            yield f'"{name}":"'.encode()
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            for chunk in out.chunks:
                yield _json_fragment(decoder.decode(chunk))
            yield _json_fragment(decoder.decode(b"", final=True)) + b'",'
        yield json.dumps(self.summary(), separators=(",", ":"))[1:].encode()


def _json_fragment(text: str) -> bytes:
    """`text` as the inside of a JSON string (ASCII, escapes included)."""
    return json.dumps(text)[1:-1].encode()


class OutputQueue:
    """Streamed output the consumer has not taken yet. Bounded: past `high_water` bytes the
    command's pipes pause (it blocks on its next write) until the consumer drains half."""

    def __init__(self, high_water: int = STREAM_HIGH_WATER) -> None:
        self.high_water = high_water
        self._items: deque[tuple[str, str]] = deque()
        self._size = 0
        self._ready = asyncio.Event()
        self._resume: Callable[[], None] | None = None

    def __call__(self, stream: str, text: str) -> bool:
        self._items.append((stream, text))
        self._size += len(text)
        self._ready.set()
        return self._size >= self.high_water

    def on_drained(self, resume: Callable[[], None]) -> None:
        self._resume = resume

    def wake(self) -> None:
        """Ends a `wait` without output (the command is done)."""
        self._ready.set()

    async def wait(self) -> None:
        """Until output is queued, or `wake`."""
        if not self._items:
            self._ready.clear()
            await self._ready.wait()

    def take(self) -> list[tuple[str, str]]:
        """Everything queued, as few pieces as the interleaving of the streams allows."""
        runs = []
        while self._items:
            runs.append(self._pop())
        return runs

    def _pop(self) -> tuple[str, str]:
        """The next piece: what is queued of one stream up to the other stream's next piece
        (or MAX_EVENT_CHARS), joined: a chatty command's output leaves in few events."""
        stream, text = self._items.popleft()
        if self._items and self._items[0][0] == stream:
            parts = [text]
            size = len(text)
            while self._items and self._next_fits(stream, size):
                size += len(self._items[0][1])
                parts.append(self._items.popleft()[1])
            text = "".join(parts)
        self._size -= len(text)
        if self._resume is not None and self._size < self.high_water // 2:
            self._resume()
        return stream, text

    def _next_fits(self, stream: str, size: int) -> bool:
        next_stream, text = self._items[0]
        return next_stream == stream and size + len(text) <= MAX_EVENT_CHARS


class _Collector:
    """Buffered: capped heads of stdout/stderr. Streamed: every byte, decoded incrementally,
    to the sink (which may ask to pause the pipes until its consumer catches up)."""

    def __init__(self, spec: CommandSpec, sink: OutputSink | None) -> None:
        self.out = {fd: CappedOutput(spec.max_output_bytes) for fd in STREAMS}
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in STREAMS}
        self._sink = sink
        self._open = set(STREAMS)
        self._readers: list[PipeReader] = []
        self.drained = asyncio.Event()
        if isinstance(sink, OutputQueue):
            sink.on_drained(self.resume)

    def read(self, proc: subprocess.Popen[bytes]) -> None:
        """Starts reading the command's stdout and stderr."""
        for fd, pipe in ((1, proc.stdout), (2, proc.stderr)):
            assert pipe is not None
            on_data = functools.partial(self.data, fd)
            self._readers.append(PipeReader(pipe, on_data, functools.partial(self.eof, fd)))

    def data(self, fd: int, data: bytes) -> bool:
        """Takes output; True when the pipe should pause."""
        if self._sink is None:
            self.out[fd].add(data)
            return False
        text = self._decoders[fd].decode(data)
        return bool(text and self._sink(STREAMS[fd], text))

    def resume(self) -> None:
        for reader in self._readers:
            reader.resume()

    def close(self) -> None:
        for reader in self._readers:
            reader.close()

    def eof(self, fd: int) -> None:
        if self._sink is not None and (tail := self._decoders[fd].decode(b"", final=True)):
            self._sink(STREAMS[fd], tail)
        self._open.discard(fd)
        if not self._open:
            self.drained.set()

    async def settle(self) -> None:
        """Waits for the pipes to drain: a short grace if a descendant holds them open, but
        as long as needed while they are paused for a consumer that is catching up."""
        while not self.drained.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DRAIN_GRACE_S):
                    await self.drained.wait()
            if not any(reader.paused for reader in self._readers):
                return


class Runner:
    """Spawns commands and tracks the running ones (their pids root the kill walks).

    Spawning goes through `spawn_command` (`subprocess.Popen`, vfork, ~1 ms) rather than the
    event loop's subprocess support (uvloop forks the whole daemon, ~4 ms); exit is watched
    via a pidfd.
    """

    def __init__(self) -> None:
        self._running: set[int] = set()

    @property
    def running_pids(self) -> set[int]:
        return set(self._running)

    def track(self, pid: int) -> None:
        """A long-lived process started elsewhere (the process table, a code context) counts
        as a root: the orphan reaper leaves it to its owner, kill walks never take it for an
        orphan."""
        self._running.add(pid)

    def untrack(self, pid: int) -> None:
        self._running.discard(pid)

    async def run(self, spec: CommandSpec, sink: OutputSink | None = None) -> CommandResult:
        started = time.monotonic()
        try:
            with step("exec.spawn"):
                proc = spawn_command(
                    spec.argv,
                    stdin=subprocess.PIPE if spec.stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=spec.cwd,
                    env=spec.env,
                    start_new_session=True,
                )
        except OSError as exc:
            return _spawn_failure(spec, exc, time.monotonic() - started, sink)
        self._running.add(proc.pid)
        collector = _Collector(spec, sink)
        stdin: asyncio.BaseTransport | None = None
        try:
            collector.read(proc)
            stdin = await _feed(proc, spec.stdin)
            timed_out = await self._wait(proc, spec.timeout_s)
            await collector.settle()
        except BaseException:
            self._kill(proc)
            raise
        finally:
            collector.close()
            if stdin is not None:
                stdin.close()
            self._running.discard(proc.pid)
            tree.reap_adopted(self._running)
        assert proc.returncode is not None
        return _result(collector, proc.returncode, timed_out, time.monotonic() - started)

    async def _wait(self, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await wait_exited(proc)
            return False
        except TimeoutError:
            self._kill(proc)
            await wait_exited(proc)
            return True

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is None:
            tree.kill_command_tree(proc.pid, self.running_pids - {proc.pid})
            proc.wait()


async def _feed(proc: subprocess.Popen[bytes], stdin: bytes | None) -> asyncio.BaseTransport | None:
    """Writes `stdin` to the command (closed once written); None when it has none."""
    if stdin is None:
        return None
    loop = asyncio.get_running_loop()
    writer, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
    writer.write(stdin)
    writer.close()
    return writer


def _settle(future: asyncio.Future[None]) -> None:
    """A reader's or writer's callback: the waiting future done, once."""
    if not future.done():
        future.set_result(None)


async def wait_exited(proc: subprocess.Popen[bytes]) -> None:
    """Waits for `proc` to exit without a thread: its pidfd becomes readable."""
    if proc.poll() is not None:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    pidfd = os.pidfd_open(proc.pid)
    loop.add_reader(pidfd, _settle, done)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    proc.wait()


def exit_status(returncode: int, timed_out: bool) -> tuple[int, int | None]:
    """(exit_code, signal): 124 on timeout, 128+N when killed by signal N."""
    sig = -returncode if returncode < 0 else None
    return (124 if timed_out else (128 + sig if sig else returncode)), sig


def _result(out: _Collector, code: int, timed_out: bool, duration: float) -> CommandResult:
    exit_code, sig = exit_status(code, timed_out)
    return CommandResult(exit_code, out.out[1], out.out[2], timed_out, sig, duration)


def _spawn_failure(
    spec: CommandSpec, exc: OSError, duration: float, sink: OutputSink | None
) -> CommandResult:
    """127 for a missing executable, 126 when it cannot be executed, as a shell reports."""
    missing = isinstance(exc, FileNotFoundError)
    message = f"sandcell: {spec.argv[0]}: {exc.strerror or exc}\n"
    stderr = CappedOutput(spec.max_output_bytes)
    kept = stderr.add(message.encode())
    if sink is not None:
        sink("stderr", kept.decode("utf-8", "replace"))
    return CommandResult(
        127 if missing else 126, CappedOutput(spec.max_output_bytes), stderr, False, None, duration
    )
