"""envd's `process.Process` service on sandcell's /v1/processes (SPEC §9)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
from collections.abc import AsyncIterator
from typing import Any

from sandcell.cellapi.limits import MAX_TIMEOUT_S
from sandcell.compat.e2b.envd.connect import StreamRequest, integer, obj
from sandcell.compat.e2b.gateway import Gateway, ndjson
from sandcell.compat.e2b.paths import to_workspace
from sandcell.errors import ErrorCode, ServiceError
from sandcell.router.core import Answer
from sandcell.store import SandboxRecord

Event = dict[str, Any]
OUTPUTS = ("stdout", "stderr", "pty")
REAP_WAIT_S, REAP_POLL_S = 2.0, 0.01  # how long a kill waits for the reap, and how often it looks
SIGNALS = {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM", 9: "SIGKILL", 15: "SIGTERM"}


def _pty(message: dict[str, Any]) -> dict[str, int] | None:
    if message.get("pty") is None:
        return None
    size = obj(obj(message, "pty"), "size")
    return {
        "cols": integer(size.get("cols"), "cols", 80),
        "rows": integer(size.get("rows"), "rows", 24),
    }


def start_body(message: dict[str, Any]) -> dict[str, Any]:
    """sandcell's process request for an envd StartRequest."""
    config = obj(message, "process")
    if not isinstance(config.get("cmd"), str) or not config["cmd"]:
        raise ServiceError(ErrorCode.BAD_REQUEST, "process.cmd is required")
    argv = [config["cmd"], *_strings(config.get("args"), "process.args")]
    command, cwd = _placed(argv, config.get("cwd"))
    return {
        "command": command,
        "cwd": cwd,
        "env": obj(config, "envs"),
        # envd keeps stdin open unless the request says `stdin: false`: SDKs that predate the
        # field (envd < 0.3.0) send none and expect it open; newer ones always send it.
        "stdin": message.get("stdin") is not False or message.get("pty") is not None,
        "pty": _pty(message),
        "tag": message.get("tag") if isinstance(message.get("tag"), str) else None,
    }


def _placed(argv: list[str], cwd: Any) -> tuple[list[str], str]:
    """(command, workspace cwd) for a process E2B starts in `cwd`. The daemon starts processes
    in the workspace only; a cwd elsewhere in the cell (E2B callers use `/`) is entered by a
    shell before the command: the cell, not the cwd, is what confines a command."""
    try:
        return argv, to_workspace(cwd)
    except ServiceError as exc:
        if exc.code is not ErrorCode.FORBIDDEN:
            raise
    return ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', cwd, *argv], "."


def _strings(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ServiceError(ErrorCode.BAD_REQUEST, f"{name} must be a list of strings")
    return value


def _end(exit_event: dict[str, Any]) -> Event:
    code, sig = exit_event.get("exit_code"), exit_event.get("signal")
    status = f"signal: {signal.Signals(sig).name.lower()[3:]}" if sig else f"exit status {code}"
    end: Event = {"exitCode": code if code is not None else -1, "exited": not sig, "status": status}
    if code:
        end["error"] = status
    return {"event": {"end": end}}


async def _events(answer: Answer, pid: int | None) -> AsyncIterator[Event]:
    """envd's events for the daemon's NDJSON lines (their base64 passed on as it is): the
    start (pid None: the answer opens with the process, whose pid it gives), the output,
    the end. The answer is read to its close after the end (it ends there), so its
    connection goes back to the pool; one left early is closed."""
    lines = ndjson(answer)
    try:
        if pid is not None:
            yield {"event": {"start": {"pid": pid}}}
        async for line in lines:
            kind = line.get("type")
            if kind in OUTPUTS:
                yield {"event": {"data": {kind: line["data_b64"]}}}
            elif kind == "process" and pid is None:
                pid = int(line["pid"])
                yield {"event": {"start": {"pid": pid}}}
            elif kind == "exit":
                if line.get("timed_out"):  # the stream's deadline, which killed it (`start`)
                    raise ServiceError(ErrorCode.SANDBOX_TIMEOUT, "the stream's deadline passed")
                yield _end(line)
                async for _ in lines:
                    pass
                return
        raise ServiceError(ErrorCode.SANDBOX_UNREACHABLE, f"process {pid}'s output ended early")
    finally:
        answer.close()


async def start(
    gateway: Gateway, record: SandboxRecord, message: StreamRequest
) -> AsyncIterator[Event]:
    """One daemon call: the process started and followed. A stream deadline bounds the
    process too, as envd's does (it is killed when the deadline passes)."""
    body = start_body(message)
    if message.timeout_s is not None:
        body["timeout_s"] = min(message.timeout_s, MAX_TIMEOUT_S)
    answer = await gateway.daemon(
        record, "POST", "processes", body=json.dumps(body).encode(), query={"follow": "true"}
    )
    async for event in _events(answer, None):
        yield event


async def resolve_pid(gateway: Gateway, record: SandboxRecord, selector: dict[str, Any]) -> int:
    """The pid a ProcessSelector names, by pid or by tag."""
    if "pid" in selector:
        return integer(selector["pid"], "pid")
    tag = selector.get("tag")
    listed = await gateway.json(record, "GET", "processes")
    for process in listed["processes"]:
        if tag is not None and process.get("tag") == tag and process["state"] == "running":
            return int(process["pid"])
    raise ServiceError(ErrorCode.NOT_FOUND, f"process with tag {tag!r} not found")


async def connect(
    gateway: Gateway, record: SandboxRecord, message: StreamRequest
) -> AsyncIterator[Event]:
    """The process's output from its start; a missing process ends the stream with
    not_found before any event, as envd's does (so the SDK's connect raises)."""
    pid = await resolve_pid(gateway, record, obj(message, "process"))
    answer = await gateway.daemon(
        record, "GET", f"processes/{pid}/output", query={"follow": "true", "offset": "0"}
    )
    async for event in _events(answer, pid):
        yield event


def _info(process: dict[str, Any]) -> dict[str, Any]:
    command = process["command"]
    argv = command if isinstance(command, list) else ["/bin/sh", "-c", command]
    info = {
        "pid": process["pid"],
        "config": {"cmd": argv[0], "args": argv[1:], "envs": {}, "cwd": process.get("cwd") or ""},
    }
    if process.get("tag") is not None:
        info["tag"] = process["tag"]
    return info


async def list_processes(
    gateway: Gateway, record: SandboxRecord, _: dict[str, Any]
) -> dict[str, Any]:
    listed = await gateway.json(record, "GET", "processes")
    running = [p for p in listed["processes"] if p["state"] == "running"]
    return {"processes": [_info(p) for p in running]}


async def send_input(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    pid = await resolve_pid(gateway, record, obj(message, "process"))
    given = obj(message, "input")
    data = given["stdin"] if given.get("stdin") is not None else given.get("pty") or ""
    if not isinstance(data, str):
        raise ServiceError(ErrorCode.BAD_REQUEST, "input must be base64 text")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise ServiceError(ErrorCode.BAD_REQUEST, "input is not base64") from exc
    await gateway.daemon(record, "POST", f"processes/{pid}/stdin", body=raw)
    return {}


async def send_signal(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    pid = await resolve_pid(gateway, record, obj(message, "process"))
    given = message.get("signal", "SIGNAL_SIGKILL")
    name = SIGNALS.get(given) if isinstance(given, (str, int)) else None
    if name is None:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"unknown signal {message.get('signal')!r}")
    body = json.dumps({"signal": name}).encode()
    try:
        await gateway.daemon(record, "POST", f"processes/{pid}/signal", body=body)
    except ServiceError as exc:
        # envd keeps no exited process to signal: the SDK's kill() answers False for it.
        if exc.code is not ErrorCode.CONFLICT:
            raise
        raise ServiceError(ErrorCode.NOT_FOUND, f"process with pid {pid} not found") from exc
    if name == "SIGKILL":
        await _reaped(gateway, record, pid)
    return {}


async def _reaped(gateway: Gateway, record: SandboxRecord, pid: int) -> None:
    """Until the daemon has reaped a killed process (boundedly): then its pid is free, as
    after envd's kill, so a `kill -0 PID` the caller runs next finds nothing."""
    deadline = asyncio.get_running_loop().time() + REAP_WAIT_S
    while asyncio.get_running_loop().time() < deadline:
        if (await gateway.json(record, "GET", f"processes/{pid}"))["state"] != "running":
            return
        await asyncio.sleep(REAP_POLL_S)


async def close_stdin(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    pid = await resolve_pid(gateway, record, obj(message, "process"))
    await gateway.daemon(record, "POST", f"processes/{pid}/stdin/close")
    return {}


async def update(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    pid = await resolve_pid(gateway, record, obj(message, "process"))
    size = _pty(message)
    if size is not None:
        await gateway.daemon(
            record, "POST", f"processes/{pid}/resize", body=json.dumps(size).encode()
        )
    return {}


UNARY = {
    "List": list_processes,
    "SendInput": send_input,
    "SendSignal": send_signal,
    "CloseStdin": close_stdin,
    "Update": update,
}
STREAMS = {"Start": start, "Connect": connect}
