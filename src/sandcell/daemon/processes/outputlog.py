"""A background process's output: the last bytes of each stream, readable from any offset.

Offsets count the process's output as one sequence (every stream, in arrival order), so a
reader that reconnects with the offset it reached gets exactly what it missed. Each stream
keeps its last `cap` bytes. A live follower holds back rotation: when it lags by more than
the cap, the producer is told to pause (the command blocks on its pipe) until it catches up,
so a follower sees every byte and memory stays bounded.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sandcell.errors import ErrorCode, ServiceError

DEFAULT_CAP = 1_048_576
_HOLD = -1  # the follower id of the initial hold


@dataclass(frozen=True)
class Chunk:
    stream: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class Lost:
    """Bytes at or after the reader's offset that were rotated out before it read them."""

    bytes: int


@dataclass
class _Stream:
    chunks: deque[Chunk] = field(default_factory=deque)
    size: int = 0


def parse_offset(raw: str) -> int:
    """An offset as written in a query string (ASCII digits only: int() takes others)."""
    if not (raw.isascii() and raw.isdigit()):
        raise ServiceError(ErrorCode.BAD_REQUEST, "offset must be a non-negative integer")
    return int(raw)


def _start(chunk: Chunk) -> int:
    return chunk.offset


class OutputLog:
    def __init__(self, streams: tuple[str, ...], cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self.end = 0
        self.closed = False
        self._streams = {name: _Stream() for name in streams}
        self._followers: dict[int, int] = {}  # id -> offset reached
        self._ids = itertools.count()  # from 0: never _HOLD
        self._wakeup = asyncio.Event()
        self._on_drained: list[Callable[[], None]] = []

    def append(self, stream: str, data: bytes) -> bool:
        """Adds output; True when the producer should pause until `when_drained` fires."""
        s = self._streams[stream]
        s.chunks.append(Chunk(stream, self.end, data))
        s.size += len(data)
        self.end += len(data)
        self._trim()
        self._wake()
        return self.over_cap

    @property
    def retained(self) -> int:
        return sum(s.size for s in self._streams.values())

    def discard(self) -> None:
        """Forgets every byte kept (a later reader is told they were lost)."""
        for s in self._streams.values():
            s.chunks.clear()
            s.size = 0

    @property
    def over_cap(self) -> bool:
        return any(s.size > self.cap for s in self._streams.values())

    def hold_for_first_reader(self, seconds: float) -> None:
        """Keeps everything from offset 0 until a live reader attaches or `seconds` pass:
        a client that starts a process and then follows it gets its first bytes too."""
        self._followers[_HOLD] = 0
        asyncio.get_running_loop().call_later(seconds, self._release_hold)

    def _release_hold(self) -> None:
        if self._followers.pop(_HOLD, None) is not None:
            self._trim()

    def when_drained(self, callback: Callable[[], None]) -> None:
        self._on_drained.append(callback)

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def _trim(self) -> None:
        floor = min(self._followers.values(), default=self.end)
        for s in self._streams.values():
            while s.size > self.cap and s.chunks[0].offset < floor:
                head = s.chunks.popleft()
                cut = min(s.size - self.cap, floor - head.offset, len(head.data))
                s.size -= cut
                if cut < len(head.data):  # keep the tail of a chunk that straddles the cap
                    s.chunks.appendleft(Chunk(head.stream, head.offset + cut, head.data[cut:]))
        if not self.over_cap and self._on_drained:
            callbacks, self._on_drained = self._on_drained, []
            for callback in callbacks:
                callback()

    def read(self, offset: int) -> tuple[list[Lost | Chunk], int]:
        """What lies at or after `offset` (a Lost first if some of it rotated out)."""
        offset = min(max(offset, 0), self.end)
        chunks = (c for s in self._streams.values() for c in s.chunks)
        kept = sorted((c for c in chunks if c.offset + len(c.data) > offset), key=_start)
        items: list[Lost | Chunk] = []
        retained = 0
        for c in kept:
            skip = max(offset - c.offset, 0)
            items.append(Chunk(c.stream, c.offset + skip, c.data[skip:]))
            retained += len(c.data) - skip
        if (lost := self.end - offset - retained) > 0:
            items.insert(0, Lost(lost))
        return items, self.end

    async def follow(self, offset: int, live: bool) -> AsyncIterator[Lost | Chunk]:
        """Everything from `offset`; with `live`, then new output until the log closes."""
        me = next(self._ids)
        self._followers[me] = max(offset, 0)
        if live:
            self._release_hold()
        try:
            while True:
                wakeup = self._wakeup
                items, self._followers[me] = self.read(self._followers[me])
                for item in items:
                    yield item
                self._trim()  # this reader moved on: older bytes may go, the pipe resume
                if not live or (self.closed and self._followers[me] >= self.end):
                    return
                await wakeup.wait()
        finally:
            del self._followers[me]
            self._trim()
