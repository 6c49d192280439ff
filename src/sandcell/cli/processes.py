"""Client commands for background processes and usage: `sandcell ps | logs | kill | stats`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sandcell.cli.common import (
    ApiKeyOpt,
    IdArg,
    JsonOpt,
    UrlOpt,
    connected,
    print_json,
    reporting,
    writer,
)

PidArg = Annotated[int, typer.Argument(metavar="PID", show_default=False)]
GIB = 1024**3


def ps(sandbox_id: IdArg, json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None):
    """List a sandbox's background processes (running, and the last ones that exited)."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        processes = sbx.commands.list()
    if json_out:
        print_json([_as_json(p) for p in processes])
        return
    typer.echo(f"{'PID':>7}  {'STATE':<8}{'EXIT':>5}  {'TAG':<12}COMMAND")
    for p in processes:
        command = p.command if isinstance(p.command, str) else " ".join(p.command)
        code = "-" if p.exit_code is None else str(p.exit_code)
        typer.echo(f"{p.pid:>7}  {p.state:<8}{code:>5}  {p.tag or '-':<12}{command}")


def _as_json(p: object) -> dict[str, object]:
    data = dict(vars(p))
    data["started_at"] = data["started_at"].isoformat()  # type: ignore[union-attr]
    return data


def logs(
    sandbox_id: IdArg,
    pid: PidArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="then output as it comes")] = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Print a background process's output (its last 1 MiB per stream); -f follows it."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        out, err = writer(sys.stdout), writer(sys.stderr)
        if follow:
            sbx.commands.connect(pid, on_stdout=out, on_stderr=err).wait()
        else:
            sbx.commands.connect(pid).replay(on_stdout=out, on_stderr=err)


def kill(
    sandbox_id: IdArg,
    pid: PidArg,
    sig: Annotated[
        str | None,
        typer.Option("--signal", "-s", help="send this signal (name or number) instead"),
    ] = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Kill a background process and all its descendants, or send it a signal."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        handle = sbx.commands.connect(pid)
        if sig is None:
            handle.kill()
        else:
            handle.signal(int(sig) if sig.isdigit() else sig)


def stats(
    sandbox_id: IdArg, json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None
) -> None:
    """CPU, memory, processes and disk of a sandbox, beside its limits."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        m = sbx.get_metrics()
    if json_out:
        print_json({**vars(m), "at": m.at.isoformat()})
        return
    typer.echo(
        f"cpu     {_num(m.cpu_percent, '%')} of {m.cpus:g} cpus ({_num(m.cpu_used_s, ' s')})"
    )
    typer.echo(f"memory  {_mib(m.memory_bytes)} / {_mib(m.memory_limit_bytes)}")
    typer.echo(f"pids    {_num(m.pids, '')} / {m.pids_limit}")
    typer.echo(f"disk    {_mib(m.disk_used_bytes)} / {_mib(m.disk_limit_bytes)}")


def _num(value: float | None, unit: str) -> str:
    return "?" if value is None else f"{value:g}{unit}"


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 1_048_576:.1f} MiB"


def register(app: typer.Typer) -> None:
    """Adds the process commands to the `sandcell` app."""
    app.command()(ps)
    app.command()(logs)
    app.command()(kill)
    app.command()(stats)
