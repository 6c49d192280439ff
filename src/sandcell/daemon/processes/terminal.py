"""Pseudo-terminals for processes: open one, size it, make it the controlling terminal.

Commands are spawned through vfork (no preexec_fn), so the child cannot call TIOCSCTTY
itself. It is already a session leader (its own session), and a session leader without a
controlling terminal acquires the first terminal it opens: a tiny `/bin/sh` prologue opens
the pty's slave once, then execs the command. Job control and `tty` then work as usual.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
from dataclasses import dataclass

TERM = "xterm-256color"
_CTTY_PROLOGUE = ': <>"$0"; exec "$@"'


@dataclass
class Pty:
    master: int
    slave: int
    slave_path: str

    def close_slave(self) -> None:
        """The daemon keeps only the master: the slave's last close signals EOF (EIO)."""
        if self.slave >= 0:
            os.close(self.slave)
            self.slave = -1


_TIOCGPTN = 0x80045430  # the pty's number (linux/asm-generic/ioctls.h)
_TIOCSPTLCK = 0x40045431  # lock or unlock its slave


def open_pty(cols: int, rows: int) -> Pty:
    """A new pty pair; the daemon keeps the master non-blocking."""
    try:
        master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
    except PermissionError:
        # Landlock may grant /dev/pts (the commands' scratch) and not /dev/ptmx: the same
        # multiplexer is reachable as /dev/pts/ptmx.
        master = os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY)
    try:
        fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
        (number,) = struct.unpack("I", fcntl.ioctl(master, _TIOCGPTN, b"\0" * 4))
        path = f"/dev/pts/{number}"
        slave = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except BaseException:
        os.close(master)
        raise
    os.set_blocking(master, False)
    resize(master, cols, rows)
    return Pty(master, slave, path)


def resize(fd: int, cols: int, rows: int) -> None:
    """The kernel sends SIGWINCH to the terminal's foreground process group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def with_controlling_tty(argv: list[str], slave_path: str) -> list[str]:
    return ["/bin/sh", "-c", _CTTY_PROLOGUE, slave_path, *argv]
