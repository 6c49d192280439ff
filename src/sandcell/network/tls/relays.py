"""The threads that serve intercepted connections, bounded, and stopped with the proxy.

Each intercepted connection runs on blocking sockets in a thread of its own (OpenSSL reads
and writes the descriptors itself and lets go of the GIL meanwhile), while the event loop
only waits for it. `Relays` bounds how many are under way (a connection past the bound is
refused by the caller, never queued), and stops a thread by shutting its sockets down, so
whatever it is blocked in returns at once: when the task waiting for it is cancelled, and
for all of them when the proxy closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
S = TypeVar("S", bound=socket.socket)
MAX_RELAYS = 64  # threads (and connection pairs) of intercepted connections, all sandboxes
JOIN_S = 5.0  # how long a stopped thread may take to end (its blocked call returns at once)


@dataclass(eq=False)
class Relay:
    """One intercepted connection: its sockets, and the thread serving it at the moment."""

    sockets: list[socket.socket] = field(default_factory=list)
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: bool = False

    def own(self, sock: socket.socket) -> socket.socket:
        """Takes `sock` into this relay: closed with it, shut down by `stop`."""
        with self.lock:
            if self.stopped:
                sock.close()
                raise ConnectionAbortedError("the proxy is closing")
            self.sockets.append(sock)
        return sock

    def swap(self, old: socket.socket, new: S) -> S:
        """`new` (an SSL socket over `old`'s descriptor) in place of `old`."""
        with self.lock:
            self.sockets[self.sockets.index(old)] = new
            if self.stopped:
                _shut(new)
        return new

    def drop(self, sock: socket.socket) -> None:
        """Closes `sock` and forgets it (a connection that failed its handshake)."""
        with self.lock:
            if sock in self.sockets:
                self.sockets.remove(sock)
        sock.close()

    def stop(self) -> None:
        """Wakes the thread: every blocked read, write or handshake returns with an error."""
        with self.lock:
            self.stopped = True
            for sock in self.sockets:
                _shut(sock)

    def close(self) -> None:
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for sock in sockets:
            sock.close()


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, not SSLSocket's (which drops its SSL object): another
    # thread may be inside that object right now. Under the relay's lock, so the descriptor
    # is still this socket's.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Relays:
    def __init__(self, limit: int = MAX_RELAYS) -> None:
        self.limit = limit
        self._live: dict[Relay, str] = {}  # each relay, and the sandbox it serves

    def __len__(self) -> int:
        return len(self._live)

    def share(self) -> int:
        """What one sandbox may hold: a quarter of the bound, so one cannot take them all."""
        return max(1, self.limit // 4)

    def reserve(self, sandbox_id: str) -> Relay | str:
        """A place for one more connection of `sandbox_id`, or why there is none."""
        if len(self._live) >= self.limit:
            return f"the relay to hosts with secrets holds {self.limit} connections, its bound"
        if sum(1 for s in self._live.values() if s == sandbox_id) >= self.share():
            return (
                f"this sandbox holds {self.share()} connections to hosts with secrets, "
                "its share of the relay"
            )
        relay = Relay()
        self._live[relay] = sandbox_id
        return relay

    def release(self, relay: Relay) -> None:
        relay.close()
        self._live.pop(relay, None)

    async def run(self, relay: Relay, work: Callable[[], T], name: str) -> T:
        """`work()` in a new thread; the caller waits without holding the loop. Cancelled,
        the relay is stopped and the thread joined before the cancellation goes on."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def report(result: T | None, error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        def target() -> None:
            result, error = None, None
            try:
                result = work()
            except BaseException as exc:  # handed to the waiting task, which raises it
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: no one waits
                loop.call_soon_threadsafe(report, result, error)

        relay.thread = threading.Thread(target=target, name=name, daemon=True)
        relay.thread.start()
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            relay.stop()
            relay.thread.join(JOIN_S)
            raise
        finally:
            if done.done() and not done.cancelled():
                done.exception()  # retrieved: no "never retrieved" warning

    async def close(self) -> None:
        """Stops every relay and waits (bounded) for its thread to end."""
        live = list(self._live)
        for relay in live:
            relay.stop()
        for relay in live:
            if relay.thread is not None:
                await asyncio.to_thread(relay.thread.join, JOIN_S)
