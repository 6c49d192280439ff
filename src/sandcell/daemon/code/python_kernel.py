"""The python language: IPython's InteractiveShell in the cell's interpreter.

Why InteractiveShell over pipes rather than ipykernel with jupyter_client: the semantics users
expect (display hook for the last expression, display publisher for `display()` and inline
matplotlib figures, `!cmd`, `%magic`, IPython's tracebacks) all live in InteractiveShell;
ipykernel adds the Jupyter wire protocol on zmq sockets, which would need TCP on loopback
(Landlock denies TCP bind in cells without network) or ipc sockets in /tmp, zmq and tornado in
the kernel, jupyter_client in the daemon, and about a second more per start. A small driver
(`ipython_driver.py`, standard library and IPython only) speaking JSON lines over inherited
pipes keeps the daemon free of all of it: nothing of IPython is imported until a python
context is first used, and then only in the context's own process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from sandcell.daemon.code.results import Event, RunOutput

DRIVER = Path(__file__).with_name("ipython_driver.py")
# Figures become image/png results (matplotlib_inline ships with IPython). IPython's profile
# and matplotlib's font cache go to the cell's tmpfs: HOME is the workspace, kept clean.
ENV_DEFAULTS = {
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "MPLCONFIGDIR": "/tmp/matplotlib",  # noqa: S108 - the cell's own tmpfs
    "IPYTHONDIR": "/tmp/ipython",  # noqa: S108
}


class JsonFramed:
    """The framing of the python and javascript drivers: a request is a JSON header line and
    the code; the `done` event carries the execution count."""

    def frame(self, run_id: int, code: str, env: Mapping[str, str]) -> bytes:
        body = code.encode("utf-8", "surrogatepass")
        header = {"id": run_id, "len": len(body), "env": dict(env)}
        return json.dumps(header).encode() + b"\n" + body

    def finish(self, done: Event, output: RunOutput) -> int | None:
        count = done.get("execution_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else None


class PythonLanguage(JsonFramed):
    name = "python"

    def __init__(self, python: str) -> None:
        self.python = python

    def argv(self, command_fd: int, event_fd: int) -> list[str]:
        # -P: the driver's directory is not put on sys.path (the driver adds the cwd instead).
        return [self.python, "-s", "-B", "-P", str(DRIVER), str(command_fd), str(event_fd)]

    def env_defaults(self) -> dict[str, str]:
        return dict(ENV_DEFAULTS)

    def check(self) -> None:
        pass  # whether IPython is there shows when the process starts

    def start_failure(self, stderr_tail: str) -> str:
        if "No module named 'IPython'" in stderr_tail:
            return (
                f"python contexts need IPython, and this sandbox's python ({self.python}) has "
                "none: use the code-interpreter template, or install sandcell's `interpreter` "
                "extra in the python sandcell runs from"
            )
        return f"the python context did not start: {stderr_tail[-1000:] or 'no output'}"
