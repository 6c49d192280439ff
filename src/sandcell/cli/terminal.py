"""`sandcell exec -it ID [-- CMD]`: an interactive terminal in a sandbox, like `docker exec -it`.

The command starts on a remote pty sized like the local terminal; a WebSocket attach then
carries keystrokes one way and the screen the other. The local terminal is in raw mode, so
Ctrl-C, Ctrl-Z and the like reach the remote process as bytes; SIGWINCH sends the new size;
the remote exit status becomes ours; the terminal is restored however this ends. Without
`-t` the command runs on pipes with stdin open (`-i`), and local EOF closes its stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from sandcell.cli.websocket import Closed, Refused, WebSocket, connect
from sandcell.client.errors import SandboxUnreachableError, error_from_reply

if TYPE_CHECKING:
    from sandcell.client import Sandbox
    from sandcell.client.processes import CommandHandle

READ_CHUNK = 65_536
CONNECT_TIMEOUT_S = 10.0
DEFAULT_SIZE = (80, 24)
EOF_KEY = b"\x04"


def interactive(
    sbx: Sandbox, command: str | list[str] | None, terminal: bool, **options: Any
) -> int:
    """Runs `command` (a login shell by default) attached to this terminal; its exit code."""
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    if terminal:
        cols, rows = _size(stdout_fd)
        handle = sbx.pty.create(cols=cols, rows=rows, cmd=command, **options)
    else:
        if command is None:
            command = "exec /bin/sh"
        handle = sbx.commands.run(command, background=True, stdin=True, timeout=None, **options)
    exited = False
    try:
        with _attached(handle) as ws, _raw(stdin_fd, enabled=terminal and os.isatty(stdin_fd)):
            code = _session(ws, handle, stdin_fd, stdout_fd, terminal)
        exited = True
        return code
    finally:
        if not exited:  # we broke off: leave nothing running behind us
            with contextlib.suppress(Exception):
                handle.kill()


@contextlib.contextmanager
def _attached(handle: CommandHandle) -> Iterator[WebSocket]:
    """The WebSocket attach; a refused upgrade raises the API's error like any call."""
    url, headers = handle.attach_target()
    try:
        ws = connect(url, headers, CONNECT_TIMEOUT_S)
    except Refused as exc:
        raise error_from_reply(exc.status, exc.headers, exc.body) from None
    except OSError as exc:
        raise SandboxUnreachableError(f"the WebSocket upgrade failed: {exc}") from None
    try:
        yield ws
    finally:
        ws.close()


def _session(ws: WebSocket, handle: CommandHandle, stdin_fd: int, stdout_fd: int, pty: bool) -> int:
    wake_r, wake_w = os.pipe()
    outcome: dict[str, Any] = {}
    reader = threading.Thread(
        target=_pump_output, args=(ws, stdout_fd, outcome, wake_w), daemon=True
    )
    try:
        with _on_resize(lambda: os.write(wake_w, b"w")):
            reader.start()
            try:
                _pump_input(ws, handle, stdin_fd, wake_r, pty)
            finally:
                reader.join(timeout=5)
    finally:
        os.close(wake_r)
        os.close(wake_w)
    if "exit" not in outcome:
        # The attach ended without the process's exit status.
        gone = outcome.get("error", "the connection closed before the command ended")
        raise SandboxUnreachableError(gone)
    return int(outcome["exit"].get("exit_code") or 0)


def _pump_output(ws: WebSocket, stdout_fd: int, outcome: dict[str, Any], wake: int) -> None:
    try:
        for message in ws.messages():
            if isinstance(message, bytes):
                _write_all(stdout_fd, message)
                continue
            event = json.loads(message)
            if event.get("type") == "exit":
                outcome["exit"] = event
            elif event.get("type") == "error":
                outcome["error"] = event.get("message")
    except (Closed, OSError, ValueError) as exc:
        outcome.setdefault("error", str(exc))
    finally:
        with contextlib.suppress(OSError):
            os.write(wake, b"x")  # the input loop stops waiting on the keyboard


def _pump_input(
    ws: WebSocket,
    handle: CommandHandle,
    stdin_fd: int,
    wake: int,
    pty: bool,
) -> None:
    """Keystrokes (and resizes) to the remote side until the output side is done."""
    stdin_open = True
    while True:
        watched = [wake, stdin_fd] if stdin_open else [wake]
        ready, _, _ = select.select(watched, [], [])
        if wake in ready:
            if os.read(wake, 64).endswith(b"x"):
                return
            cols, rows = _size(sys.stdout.fileno())
            ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        if stdin_open and stdin_fd in ready:
            data = os.read(stdin_fd, READ_CHUNK)
            if data:
                ws.send(data)
            else:  # local end of input: the remote one too
                stdin_open = False
                if pty:
                    ws.send(EOF_KEY)
                else:
                    handle.close_stdin()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_SIZE
    return size.columns or DEFAULT_SIZE[0], size.lines or DEFAULT_SIZE[1]


@contextlib.contextmanager
def _raw(fd: int, enabled: bool) -> Iterator[None]:
    """Raw mode for the session; the saved mode comes back whatever happens."""
    if not enabled:
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _on_resize(notify: Any) -> Iterator[None]:
    """SIGWINCH only wakes the input loop (a handler must not use the connection)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            notify()

    previous = signal.signal(signal.SIGWINCH, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)
