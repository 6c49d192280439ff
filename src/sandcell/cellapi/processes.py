"""The daemon's process API bodies (SPEC §9)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from sandcell.cellapi.schemas import MAX_TIMEOUT_S, ExecRequest, _Strict

MAX_TAG = 256
DEFAULT_BUFFER = 1_048_576
MAX_BUFFER = 8 * 1_048_576
MAX_TERMINAL_SIZE = 10_000


class TerminalSize(_Strict):
    cols: int = Field(80, ge=1, le=MAX_TERMINAL_SIZE)
    rows: int = Field(24, ge=1, le=MAX_TERMINAL_SIZE)


class StartProcess(ExecRequest):
    """`timeout_s` 0 means no limit: the sandbox's lifetime bounds the process."""

    timeout_s: float = Field(0, ge=0, le=MAX_TIMEOUT_S)  # type: ignore[assignment]
    stdin: bool = False  # type: ignore[assignment]
    pty: TerminalSize | None = None
    tag: str | None = Field(None, max_length=MAX_TAG)
    # A process keeps a replay buffer per stream instead of a head (see max_buffer_bytes).
    max_output_bytes: None = None  # type: ignore[assignment]
    max_buffer_bytes: int = Field(DEFAULT_BUFFER, ge=1024, le=MAX_BUFFER)


class ProcessInfo(BaseModel):
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


class ProcessList(BaseModel):
    processes: list[ProcessInfo]


class SignalRequest(_Strict):
    signal: str | int = Field(description='A name ("SIGINT" or "INT") or a number.')
