"""Reading a command's output pipe from the event loop.

uvloop's pipe transport does one 64 KiB read per wake-up of the loop from a 64 KiB pipe. This
reader waits for readiness with `add_reader` and then reads until the pipe is drained (up to
`READS_PER_WAKEUP` reads), from a pipe grown to `PIPE_BYTES`: a fast writer costs few
wake-ups, a slow one's output still goes on as soon as it is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable
from typing import IO

# Pieces of 64 KiB, several per wake-up: glibc serves an allocation of 128 KiB or more with
# a fresh mmap each time, whose page faults made 1 MiB reads cost the daemon ~25 % more per MB.
READ_BYTES = 65_536
READS_PER_WAKEUP = 16
# The kernel's default ceiling for an unprivileged F_SETPIPE_SZ (fs.pipe-max-size): the command
# runs ahead by this much while the daemon is busy writing, and one wake-up drains it.
PIPE_BYTES = 1_048_576

# Takes a piece of output; True asks to pause reading until `resume`.
OnData = Callable[[bytes], bool]


class PipeReader:
    """One pipe's read end: pieces to `on_data`, then `on_eof` once (EOF or a read error)."""

    def __init__(self, pipe: IO[bytes], on_data: OnData, on_eof: Callable[[], None]) -> None:
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._on_data = on_data
        self._on_eof = on_eof
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self.closed = False
        os.set_blocking(self._fd, False)
        # Best effort: the pages count against the cell user's pipe quota (pipe-user-pages-soft,
        # 64 MiB: 32 commands at once); past it the kernel refuses, and 64 KiB works too.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.resume()

    @property
    def paused(self) -> bool:
        return not (self._reading or self.closed)

    def pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def resume(self) -> None:
        if not (self._reading or self.closed):
            self._loop.add_reader(self._fd, self._readable)
            self._reading = True

    def close(self) -> None:
        """Stops reading and closes the pipe; what is still in it is dropped."""
        self.pause()
        if not self.closed:
            self.closed = True
            self._pipe.close()

    def _readable(self) -> None:
        for _ in range(READS_PER_WAKEUP):
            try:
                data = os.read(self._fd, READ_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""  # an I/O error ends the stream like EOF, as uvloop's transport does
            if not data:
                self.close()
                self._on_eof()
                return
            if self._on_data(data):
                self.pause()
                return
            if len(data) < READ_BYTES:
                return  # drained: wait for the next write rather than read EAGAIN
