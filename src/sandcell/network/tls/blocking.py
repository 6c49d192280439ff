"""One h11 connection over one SSL socket in blocking mode, for a relay's thread.

OpenSSL reads and writes the socket itself (no memory BIO to copy through), and every
blocking call is bounded by the socket's timeout (`idle_s`): a peer that stalls ends the
connection with TimeoutError. A read takes what one call brings and then, without
waiting, whatever else has already arrived, up to `CHUNK`: OpenSSL hands over one TLS
record (16 KiB) per call, and h11 and the rewrite then run once per chunk, not per record.
"""

from __future__ import annotations

import select
import ssl
from collections.abc import Callable
from typing import cast

import h11

CHUNK = 262_144  # what one read may bring: big enough that per-read costs do not count
MAX_HEAD = 65_536
SMALL = 16_384  # what is joined before it is sent (a TLS record's worth): larger goes as is
Piece = bytes | bytearray | memoryview


class Side:
    def __init__(
        self,
        role: type[h11.CLIENT] | type[h11.SERVER],
        sock: ssl.SSLSocket,
        idle_s: float,
        count: Callable[[int], None],
    ) -> None:
        self.conn = h11.Connection(role, max_incomplete_event_size=MAX_HEAD)
        self.sock = sock
        self.idle_s = idle_s
        self.count = count
        self.role = role
        self.raw = bytearray(CHUNK)
        self.buffer = memoryview(self.raw)
        self.fresh = self.spent = False  # see `restart`
        self.pending: list[Piece] = []
        sock.settimeout(idle_s)

    def next_event(self) -> object:
        """The next event, waiting (up to `idle_s` per read) for the bytes it needs."""
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.receive(wait=True)
        return event

    def ready_event(self) -> object:
        """The next event if what has arrived makes one, else NEED_DATA (never waits)."""
        event = self.conn.next_event()
        if event is h11.NEED_DATA and self.receive(wait=False):
            event = self.conn.next_event()
        return event

    def receive(self, *, wait: bool) -> bool:
        """Hands what has arrived to h11 (an end too); with `wait`, waits for the first
        byte. False when nothing had arrived."""
        filled, ended = self._fill(self.buffer, wait=wait)
        if filled:
            self.conn.receive_data(cast(bytes, self.buffer[:filled]))  # h11 copies it
        if ended:
            self.conn.receive_data(b"")
        return bool(filled) or ended

    def read_raw(self, buffer: bytearray, limit: int) -> int:
        """Reads up to `limit` bytes into `buffer`, past h11 (a body whose length h11 has
        read from the head), waiting for the first; 0 at the end."""
        return self._fill(memoryview(buffer)[:limit], wait=True)[0]

    def _fill(self, into: memoryview, *, wait: bool) -> tuple[int, bool]:
        """(bytes read into `into`, whether the peer ended)."""
        filled, ended, limit = 0, False, len(into)
        if wait:
            filled = self.sock.recv_into(into)
            ended = not filled
        if not ended:
            self.sock.settimeout(0)
            try:
                while filled < limit:
                    got = self.sock.recv_into(into[filled:])
                    if not got:
                        ended = True
                        break
                    filled += got
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            finally:
                self.sock.settimeout(self.idle_s)
        return filled, ended

    def restart(self, reusable: bool) -> None:
        """h11 afresh once a body was read past it: for the next request if `reusable`,
        else the connection ends after this exchange."""
        self.conn = h11.Connection(self.role, max_incomplete_event_size=MAX_HEAD)
        self.fresh, self.spent = reusable, not reusable

    def next_cycle(self) -> None:
        if self.fresh:
            self.fresh = False
        else:
            self.conn.start_next_cycle()

    def has_bytes(self) -> bool:
        """Whether a read would find something at once (decrypted bytes held by OpenSSL)."""
        return self.sock.pending() > 0

    def send(self, event: h11.Event, *, now: bool = True) -> None:
        """Sends `event`; a head sent with `now=False` leaves with what follows it, in one
        write (one TCP segment: no small write for Nagle's algorithm to hold)."""
        self.pending += self.conn.send_with_data_passthrough(event) or []
        if now:
            self.flush()

    def send_body(self, pieces: list[Piece]) -> None:
        """Body bytes as they are (views of a bulk chunk are framed by h11, not copied)."""
        for piece in pieces:  # h11 takes any buffer, though typed for bytes
            data = h11.Data(data=cast(bytes, piece))
            self.pending += self.conn.send_with_data_passthrough(data) or []
        self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        out, self.pending = self.pending, []
        size = sum(map(len, out))
        self.count(size)
        if len(out) > 1 and size <= SMALL:
            out = [b"".join(out)]  # a head and a small body: one TLS record, not several
        for piece in out:
            self.sock.sendall(piece)


def wait_readable(sides: tuple[Side, ...], timeout_s: float) -> list[Side]:
    """The sides a read would find something on, waiting up to `timeout_s` for one."""
    if ready := [side for side in sides if side.has_bytes()]:
        return ready
    poll = select.poll()
    by_fd = {side.sock.fileno(): side for side in sides}
    for fd in by_fd:
        poll.register(fd, select.POLLIN | select.POLLPRI)
    events = poll.poll(timeout_s * 1000)
    if not events:
        raise TimeoutError(f"nothing arrived for {timeout_s:g} s")
    return [by_fd[fd] for fd, _ in events]
