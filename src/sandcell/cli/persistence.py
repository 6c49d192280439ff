"""`sandcell pause|resume|snapshot|fork ID` and `sandcell snapshots ls|rm` (SPEC §13).

Pause and snapshots keep files only: running processes and memory are not kept.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from sandcell.cli.common import ApiKeyOpt, IdArg, JsonOpt, UrlOpt, connected, print_json, reporting

snapshots_app = typer.Typer(help="Snapshots of sandbox workspaces.", no_args_is_help=True)


def pause(sandbox_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Pause sandbox ID: its processes end, its files are kept (memory is not)."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        typer.echo(sbx.pause().state)


def resume(sandbox_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Resume paused sandbox ID in a new cell, on its kept files."""
    with reporting():
        from sandcell.client import Sandbox

        with contextlib.closing(Sandbox.resume(sandbox_id, api_key=api_key, url=url)) as sbx:
            typer.echo(sbx.last_info.state)


def snapshot(
    sandbox_id: IdArg,
    name: Annotated[str | None, typer.Option("--name", help="a label for the snapshot")] = None,
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Snapshot sandbox ID's files and print the snapshot's id."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        snap = sbx.snapshot(name=name)
    if json_out:
        print_json(snap.to_dict())
    else:
        typer.echo(snap.id)


def fork(sandbox_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Start a new sandbox on a copy of sandbox ID's files and print its id."""
    with reporting():
        from sandcell.client import Sandbox

        with contextlib.closing(Sandbox.fork_of(sandbox_id, api_key=api_key, url=url)) as sbx:
            typer.echo(sbx.id)


@snapshots_app.command("ls")
def snapshots_ls(json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """List your snapshots."""
    with reporting():
        from sandcell.client import Sandbox

        snapshots = Sandbox.list_snapshots(api_key=api_key, url=url)
    if json_out:
        print_json([s.to_dict() for s in snapshots])
        return
    if not snapshots:
        typer.echo("no snapshots", err=True)
    for s in snapshots:
        created = s.created_at.strftime("%Y-%m-%d %H:%M:%S")
        typer.echo(f"{s.id}  {s.sandbox_id}  {s.size_bytes:>12}  {created}  {s.name or ''}")


@snapshots_app.command("rm")
def snapshots_rm(
    snapshot_id: Annotated[str, typer.Argument(metavar="SNAPSHOT_ID", show_default=False)],
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete a snapshot (exit code 1 if you have none by that id)."""
    with reporting():
        from sandcell.client import Sandbox

        deleted = Sandbox.delete_snapshot(snapshot_id, api_key=api_key, url=url)
    if not deleted:
        typer.echo(f"no snapshot {snapshot_id}", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    for command in (pause, resume, snapshot, fork):
        app.command()(command)
    app.add_typer(snapshots_app, name="snapshots")
