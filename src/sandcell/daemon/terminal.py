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


def open_pty(cols: int, rows: int) -> Pty:
    master, slave = os.openpty()
    os.set_blocking(master, False)
    resize(master, cols, rows)
    return Pty(master, slave, os.ttyname(slave))


def resize(fd: int, cols: int, rows: int) -> None:
    """The kernel sends SIGWINCH to the terminal's foreground process group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def with_controlling_tty(argv: list[str], slave_path: str) -> list[str]:
    return ["/bin/sh", "-c", _CTTY_PROLOGUE, slave_path, *argv]
