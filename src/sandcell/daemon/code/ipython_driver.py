"""The python context's process: IPython's InteractiveShell driven over two pipes.

Run by the context's interpreter as a script (`python -s -B ipython_driver.py CMD_FD EVENT_FD`),
it imports nothing of sandcell: only the standard library and IPython, so it works with the
venv sandcell runs from or with an image's own python3 that has IPython.

Requests arrive on CMD_FD, each a JSON header line `{"id", "len", "env"}` followed by `len`
bytes of UTF-8 code. Events leave on EVENT_FD as JSON lines: `ready` once, then for each run
`result` (a MIME bundle, from the display hook or the display publisher), `error`, and `done`
with the execution count. A matplotlib figure's bundle also carries `e2b/chart`, the figure's
data as E2B's `e2b_charts` package extracts it, where that package is installed. Stdout and
stderr stay the process's fds 1 and 2 (pipes the daemon reads), so `print`, `!cmd` children
and C extensions all land there, in the order written.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import io
import json
import os
import signal
import sys
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.formatters import BaseFormatter
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

_PR_SET_PDEATHSIG = 1


class Channel:
    """Where events go, and which run they belong to."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.run_id = 0

    def send(self, event: dict[str, Any]) -> None:
        event = {**event, "id": self.run_id}
        try:
            text = json.dumps(event, default=as_json)
        except (TypeError, ValueError, RecursionError):  # odd keys, cycles: keep the text
            plain = str(event.get("data", {}).get("text/plain", "<a result JSON cannot hold>"))
            text = json.dumps({**event, "data": {"text/plain": plain}})
        line = text.encode() + b"\n"
        # Whatever was printed before this event reaches the daemon first.
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        write_all(self.fd, line)


CHANNEL: Channel


def as_json(value: Any) -> Any:
    """JSON for what json cannot encode: numpy's scalars and arrays as numbers and lists (a
    chart's ticks are numpy's), anything else as its repr."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        with contextlib.suppress(Exception):
            return tolist()
    return repr(value)


def bundle(data: dict[str, Any]) -> dict[str, Any]:
    """Binary representations (PNG, JPEG, PDF) as base64; the daemon keeps the known types."""
    return {
        mime: base64.b64encode(value).decode() if isinstance(value, bytes | bytearray) else value
        for mime, value in data.items()
    }


class ResultHook(DisplayHook):
    """The value of the run's last expression: the main result."""

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: dict[str, Any], md_dict: Any = None) -> None:
        CHANNEL.send({"type": "result", "is_main_result": True, "data": bundle(format_dict)})

    def finish_displayhook(self) -> None:
        pass


class ResultPublisher(DisplayPublisher):
    """`display(...)` and matplotlib's inline figures: further results."""

    def publish(self, data: dict[str, Any], metadata: Any = None, *args: Any, **kw: Any) -> None:
        CHANNEL.send({"type": "result", "is_main_result": False, "data": bundle(data)})

    def clear_output(self, wait: bool = False) -> None:
        pass


class ChartFormatter(BaseFormatter):  # type: ignore[misc]
    """A figure's data (type, title, labels, ticks, elements) beside its PNG, in E2B's shape.

    Asked of every displayed object: nothing is imported unless the object is a matplotlib
    figure (which exists only once the user imported matplotlib), and an extractor that is
    missing or fails leaves the figure with its PNG alone."""

    format_type = "e2b/chart"

    def __call__(self, obj: Any) -> dict[str, Any] | None:
        figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
        if figure is None or not isinstance(obj, figure):
            return None
        try:
            from e2b_charts import chart_figure_to_dict  # type: ignore[import-untyped]
        except ImportError:
            return None
        try:
            return chart_figure_to_dict(obj) or None
        except Exception:
            return None


class Shell(InteractiveShell):
    displayhook_class = ResultHook
    display_pub_class = ResultPublisher
    # `!cmd` writes to our stdout and stderr pipes directly (no pty needed).
    system = InteractiveShell.system_raw

    def enable_gui(self, gui: str | None = None) -> None:
        """`%matplotlib inline` needs no event loop; a GUI's cannot run without a display."""
        if gui not in (None, "inline"):
            raise UsageError(f"no {gui} GUI in a sandbox: use %matplotlib inline")

    def _showtraceback(self, etype: type, evalue: BaseException, stb: list[str]) -> None:
        CHANNEL.send(
            {
                "type": "error",
                "name": getattr(etype, "__name__", str(etype)),
                "value": str(evalue),
                "traceback": self.InteractiveTB.stb2text(stb),
            }
        )


def read_exactly(stream: io.BufferedReader, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError
    return data


def run_one(shell: Shell, header: dict[str, Any], code: str) -> None:
    """One run, with its env set for the run only; `done` always follows."""
    saved = {name: os.environ.get(name) for name in header.get("env", {})}
    os.environ.update(header.get("env", {}))
    try:
        shell.run_cell(code, store_history=True)
    except KeyboardInterrupt:
        pass  # an interrupt landing outside the user's code: the run is over anyway
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    CHANNEL.send({"type": "done", "execution_count": shell.execution_count - 1})


def serve(commands: io.BufferedReader, shell: Shell) -> None:
    while True:
        try:
            line = commands.readline()
            if not line:
                return  # the daemon is gone
            header = json.loads(line)
            code = read_exactly(commands, int(header["len"])).decode("utf-8", "replace")
            CHANNEL.run_id = int(header["id"])
            run_one(shell, header, code)
        except KeyboardInterrupt:
            continue  # a late interrupt between runs
        except EOFError:
            return


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FdWriter(io.RawIOBase):
    """Unbuffered and whole: output interleaves with `!cmd` children's exactly as written."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @property
    def name(self) -> int:
        """What `TextIOWrapper.name` reports: the fd, as `FileIO(fd).name` does."""
        return self.fd

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        write_all(self.fd, bytes(data))
        return len(data)


def unbuffered_text(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(FdWriter(fd), encoding="utf-8", errors="replace", write_through=True)


def main() -> None:
    global CHANNEL
    command_fd, event_fd = int(sys.argv[1]), int(sys.argv[2])
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for fd in (command_fd, event_fd):
        os.set_inheritable(fd, False)  # never leaked to `!cmd` children
    sys.stdout, sys.stderr = unbuffered_text(1), unbuffered_text(2)
    sys.path.insert(0, "")  # modules in the working directory import, as in Jupyter
    CHANNEL = Channel(event_fd)
    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # no sqlite file anywhere
    shell = Shell.instance(config=config, colors="nocolor")
    display = shell.display_formatter
    assert display is not None  # made by the shell's init
    display.formatters[ChartFormatter.format_type] = ChartFormatter(parent=display)
    CHANNEL.send({"type": "ready"})
    with open(command_fd, "rb") as commands:
        serve(commands, shell)


if __name__ == "__main__":
    main()
