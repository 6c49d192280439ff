"""The daemon's process API bodies (SPEC §9)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from sandcell.cellapi.schemas import MAX_TIMEOUT_S, ExecRequest, Shape, Strict

MAX_TAG = 256
DEFAULT_BUFFER = 1_048_576
MAX_BUFFER = 8 * 1_048_576
MAX_TERMINAL_SIZE = 10_000

_Side = Annotated[int, Meta(ge=1, le=MAX_TERMINAL_SIZE)]


class TerminalSize(Strict):
    cols: _Side = 80
    rows: _Side = 24


class StartProcess(ExecRequest):
    """`timeout_s` 0 means no limit: the sandbox's lifetime bounds the process."""

    timeout_s: Annotated[float, Meta(ge=0, le=MAX_TIMEOUT_S)] = 0
    stdin: bool = False  # type: ignore[assignment]
    pty: TerminalSize | None = None
    tag: Annotated[str, Meta(max_length=MAX_TAG)] | None = None
    # A process keeps a replay buffer per stream instead of a head (see max_buffer_bytes).
    max_output_bytes: None = None  # type: ignore[assignment]
    max_buffer_bytes: Annotated[int, Meta(ge=1024, le=MAX_BUFFER)] = DEFAULT_BUFFER


class ProcessInfo(Shape):
    pid: int
    tag: str | None
    command: str | list[str]
    cwd: str
    pty: bool
    started_at: str
    state: Literal["running", "exited"]
    exit_code: int | None
    signal: int | None
    timed_out: bool


class ProcessList(Shape):
    processes: list[ProcessInfo]


class SignalRequest(Strict):
    signal: Annotated[str | int, Meta(description='A name ("SIGINT" or "INT") or a number.')]
