"""The streamed exec response (SPEC §2.2): NDJSON output events as they come, then the exit.

Output that arrived while the previous write was in flight leaves in one write, adjacent
pieces of one stream joined into one event; so a fast command costs few, big events and a
slow one still gets each piece out at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator

import msgspec

from sandcell.daemon.exec.runner import CommandSpec, OutputQueue, Runner
from sandcell.http import ndjson

_ENCODER = msgspec.json.Encoder()
# Lines go out in writes of about this size: one write per small event would cost the HTTP
# layer a send each, one huge write fresh memory (see runner.MAX_EVENT_CHARS).
WRITE_BYTES = 65_536


async def exec_stream(runner: Runner, spec: CommandSpec) -> AsyncIterator[bytes]:
    """Runs `spec`, yielding NDJSON. The queue is bounded: a reader that falls behind holds
    the command back instead of growing the daemon. If the reader goes away, the command is
    cancelled (the runner kills it)."""
    queue = OutputQueue()
    task = asyncio.ensure_future(runner.run(spec, queue))
    task.add_done_callback(lambda _: queue.wake())
    try:
        while True:
            if queued := queue.take():
                for batch in _batches(output_line(stream, text) for stream, text in queued):
                    yield batch
            elif task.done():
                break
            else:
                await queue.wait()
        yield ndjson.line({"type": "exit", **task.result().summary()})
    finally:
        task.cancel()


def output_line(stream: str, text: str) -> bytes:
    """`ndjson.line({"type": stream, "data": text})`, byte for byte. For ASCII text msgspec
    writes the same JSON ~5x faster than `json`; the one ASCII difference is DEL, which
    `json` escapes (and so does every non-ASCII character: those take `json`)."""
    event = {"type": stream, "data": text}
    if text.isascii() and "\x7f" not in text:
        return _ENCODER.encode(event) + b"\n"
    return ndjson.line(event)


def _batches(lines: Iterable[bytes]) -> Iterator[bytes]:
    """`lines` joined into pieces of up to WRITE_BYTES (a longer line goes alone)."""
    batch: list[bytes] = []
    size = 0
    for line in lines:
        if batch and size + len(line) > WRITE_BYTES:
            yield b"".join(batch)
            batch, size = [], 0
        batch.append(line)
        size += len(line)
    if batch:
        yield b"".join(batch)
