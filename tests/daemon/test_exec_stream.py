"""The streamed exec response (`exec_stream`) on a real runner and real commands, in-process:
the bytes, their order and events, the encoder against `json`, back-pressure, cancellation."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandcell.daemon.exec import spawn
from sandcell.daemon.exec.runner import MAX_EVENT_CHARS, CommandSpec, Runner
from sandcell.daemon.exec.stream import WRITE_BYTES, exec_stream, output_line
from sandcell.http import ndjson

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", autouse=True)
def _spawner() -> None:
    """The daemon's spawner thread, unconfined (this test process is not a cell)."""
    with contextlib.suppress(RuntimeError):  # already running in this process
        spawn.start(spawn.OwnOomScore(), confine=None)


def _spec(command: str, cwd: Path, timeout_s: float = 30) -> CommandSpec:
    return CommandSpec(
        argv=["/bin/sh", "-c", command],
        cwd=str(cwd),
        env={"PATH": "/usr/bin:/bin"},
        timeout_s=timeout_s,
        stdin=None,
        max_output_bytes=1 << 20,
    )


async def _events(stream: AsyncIterator[bytes]) -> tuple[list[dict[str, Any]], int]:
    """The events of a whole stream, and how many writes carried them."""
    writes = [piece async for piece in stream]
    assert all(piece.endswith(b"\n") for piece in writes)  # a write never splits a line
    lines = b"".join(writes).splitlines()
    return [json.loads(line) for line in lines], len(writes)


def _text(events: list[dict[str, Any]], stream: str) -> str:
    return "".join(e["data"] for e in events if e["type"] == stream)


async def test_fast_output_leaves_in_few_bounded_events(tmp_path: Path):
    """8 MB written 4 KiB at a time, read by a client that takes 5 ms per write: what piles
    up meanwhile leaves whole, in events of at most MAX_EVENT_CHARS."""
    size = 8_000_000
    command = f"yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {size}"
    events, writes = await _events(_slowly(exec_stream(Runner(), _spec(command, tmp_path))))
    output = [e for e in events if e["type"] == "stdout"]
    assert _text(events, "stdout") == ("0123456789abcdefghijklmnopqrstuvwxyz\n" * size)[:size]
    assert all(len(e["data"]) <= MAX_EVENT_CHARS for e in output)
    assert len(output) < 3 * size / MAX_EVENT_CHARS  # not one event per pipe write (~2000)
    assert writes <= len(output) + 1
    assert events[-1] == {**events[-1], "type": "exit", "exit_code": 0, "timed_out": False}


async def _slowly(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for piece in stream:
        yield piece
        await anyio.sleep(0.005)


async def test_small_pieces_of_one_stream_are_joined_in_order(tmp_path: Path):
    """Output queued while the consumer is away leaves as one event per run of a stream, in
    the order it was written."""
    command = (
        "for i in $(seq 200); do echo out$i; done; sleep 0.05; echo err >&2; sleep 0.5; echo late"
    )
    stream = exec_stream(Runner(), _spec(command, tmp_path))
    first = await anext(stream)  # the command starts; then its output piles up
    await anyio.sleep(0.3)
    events, _ = await _events(_chain(first, stream))
    assert _text(events, "stdout") == "".join(f"out{i}\n" for i in range(1, 201)) + "late\n"
    assert _text(events, "stderr") == "err\n"
    kinds = [e["type"] for e in events]
    assert kinds.index("stderr") < len(kinds) - 2  # err came before "late" and the exit
    assert len(events) <= 5


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for piece in rest:
        yield piece


async def test_utf8_split_across_reads_is_whole(tmp_path: Path):
    """Two-byte characters cut by 64 KiB reads decode whole; invalid bytes are replaced."""
    command = "head -c 300001 /dev/zero | tr '\\0' x; yes é | head -c 400000; printf '\\377'"
    events, _ = await _events(exec_stream(Runner(), _spec(command, tmp_path)))
    written = b"x" * 300001 + ("é\n" * 200_000).encode()[:400000] + b"\377"
    assert _text(events, "stdout") == written.decode("utf-8", "replace")


async def test_a_timeout_ends_the_stream_with_its_exit(tmp_path: Path):
    spec = _spec("echo started; sleep 30", tmp_path, timeout_s=0.5)
    with anyio.fail_after(10):
        events, _ = await _events(exec_stream(Runner(), spec))
    assert _text(events, "stdout") == "started\n"
    assert events[-1]["timed_out"] is True and events[-1]["exit_code"] == 124


async def test_a_reader_that_stops_holds_the_command_back(tmp_path: Path):
    """Bounded: unread output blocks the command in its pipe instead of growing the daemon."""
    runner = Runner()
    done = tmp_path / "done"
    command = f"head -c 50000000 /dev/zero; touch {done}"
    stream = exec_stream(runner, _spec(command, tmp_path))
    await anext(stream)
    await anyio.sleep(0.5)
    assert not done.exists() and runner.running_pids
    await stream.aclose()  # the client went away: the command is killed
    with anyio.fail_after(5):
        while runner.running_pids:
            await anyio.sleep(0.02)
    assert not done.exists()


async def test_writes_stay_near_their_size_when_many_events_wait(tmp_path: Path):
    """Alternating streams make many small events: they share writes of ~WRITE_BYTES."""
    command = "for i in $(seq 3000); do echo o$i; echo e$i >&2; done"
    stream = exec_stream(Runner(), _spec(command, tmp_path))
    first = await anext(stream)
    await anyio.sleep(1)
    writes = [first] + [piece async for piece in stream]
    assert all(len(piece) <= WRITE_BYTES for piece in writes)
    assert len(writes) < 40  # ~6000 events
    events = [json.loads(line) for line in b"".join(writes).splitlines()]
    assert _text(events, "stdout") == "".join(f"o{i}\n" for i in range(1, 3001))
    assert _text(events, "stderr") == "".join(f"e{i}\n" for i in range(1, 3001))


def _samples() -> list[str]:
    rng = random.Random(20)
    alphabet = [chr(c) for c in range(128)] + ["é", "€", "\U0001f600", "\ufffd", "\u2028"]
    texts = [chr(c) for c in range(128)] + ["", "plain text\n" * 1000, "tab\there"]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(1, 3000))) for _ in range(300)]
    return texts


def test_output_lines_are_byte_for_byte_what_json_writes():
    """The wire format does not change: every line equals `ndjson.line` of the event."""
    for text in _samples():
        for stream in ("stdout", "stderr"):
            assert output_line(stream, text) == ndjson.line({"type": stream, "data": text})
