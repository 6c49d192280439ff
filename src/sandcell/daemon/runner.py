"""Runs one command: spawn, feed stdin, collect capped output, enforce the timeout."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sandcell.daemon import processes
from sandcell.daemon.spawn import spawn_command

DRAIN_GRACE_S = 0.1
STREAMS = {1: "stdout", 2: "stderr"}

OutputSink = Callable[[str, str], None]


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


class _Collector:
    """Capped buffers for stdout/stderr, decoded incrementally when streamed."""

    def __init__(self, spec: CommandSpec, sink: OutputSink | None) -> None:
        self.out = {fd: CappedOutput(spec.max_output_bytes) for fd in STREAMS}
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in STREAMS}
        self._sink = sink
        self._open = set(STREAMS)
        self.drained = asyncio.Event()

    def data(self, fd: int, data: bytes) -> None:
        kept = self.out[fd].add(data)
        if self._sink is not None and kept and (text := self._decoders[fd].decode(kept)):
            self._sink(STREAMS[fd], text)

    def eof(self, fd: int) -> None:
        if self._sink is not None and (tail := self._decoders[fd].decode(b"", final=True)):
            self._sink(STREAMS[fd], tail)
        self._open.discard(fd)
        if not self._open:
            self.drained.set()


class _PipeReader(asyncio.Protocol):
    def __init__(self, fd: int, collector: _Collector) -> None:
        self.fd = fd
        self.collector = collector

    def data_received(self, data: bytes) -> None:
        self.collector.data(self.fd, data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.collector.eof(self.fd)


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

    async def run(self, spec: CommandSpec, sink: OutputSink | None = None) -> CommandResult:
        started = time.monotonic()
        try:
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
        transports: list[asyncio.BaseTransport] = []
        try:
            transports = await _attach(proc, spec.stdin, collector)
            timed_out = await self._wait(proc, spec.timeout_s)
            if not collector.drained.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DRAIN_GRACE_S):
                        await collector.drained.wait()
        except BaseException:
            self._kill(proc)
            raise
        finally:
            for transport in transports:
                transport.close()
            self._running.discard(proc.pid)
            processes.reap_adopted(self._running)
        assert proc.returncode is not None
        return _result(collector, proc.returncode, timed_out, time.monotonic() - started)

    async def _wait(self, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await _exited(proc)
            return False
        except TimeoutError:
            self._kill(proc)
            await _exited(proc)
            return True

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is None:
            processes.kill_command_tree(proc.pid, self.running_pids - {proc.pid})
            proc.wait()


async def _attach(
    proc: subprocess.Popen[bytes], stdin: bytes | None, collector: _Collector
) -> list[asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    transports: list[asyncio.BaseTransport] = []
    for fd, pipe in ((1, proc.stdout), (2, proc.stderr)):
        transport, _ = await loop.connect_read_pipe(lambda fd=fd: _PipeReader(fd, collector), pipe)
        transports.append(transport)
    if stdin is not None:
        writer, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
        writer.write(stdin)
        writer.close()
    return transports


async def _exited(proc: subprocess.Popen[bytes]) -> None:
    """Waits for `proc` to exit without a thread: its pidfd becomes readable."""
    if proc.poll() is not None:
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    pidfd = os.pidfd_open(proc.pid)
    loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    proc.wait()


def _result(out: _Collector, code: int, timed_out: bool, duration: float) -> CommandResult:
    sig = -code if code < 0 else None
    exit_code = 124 if timed_out else (128 + sig if sig else code)
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
