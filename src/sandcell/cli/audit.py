"""`sandcell audit verify | tail` (SPEC §20).

`verify` checks every writer's chain in the configured store (the same `--config` /
`--data-dir` as `sandcell serve`), one finding a line; exit 1 if any. `tail` reads the trail
through the API (`--url`, `--api-key`) as one JSON object a line, from `--since` on; with
`-f` it goes on printing new records as they come (asking once a `--every` seconds)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sandcell.cli import ConfigOpt, DataDirOpt, _settings
from sandcell.cli.common import ApiKeyOpt, UrlOpt, reporting

if TYPE_CHECKING:
    from sandcell.audit.verify import Report

audit_app = typer.Typer(help="The audit trail: verify, tail.", no_args_is_help=True)
DEFAULT_SINCE_S = 3600


@audit_app.command("verify")
def verify(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Check that no audit record was changed, removed or reordered."""
    import asyncio

    from sandcell.audit.verify import verify_store
    from sandcell.serve import opened_store

    async def check() -> Report:
        async with opened_store(_settings(config, data_dir)) as store:
            return await verify_store(store)

    report = asyncio.run(check())
    for finding in report.findings:
        typer.echo(str(finding))
    if report.findings:
        raise typer.Exit(1)
    typer.echo(f"audit trail intact: {report.records} records of {report.writers} writers")


@audit_app.command("tail")
def tail(
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="keep printing new records")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="epoch seconds or ISO 8601 (default: an hour ago)", show_default=False),
    ] = None,
    sandbox: Annotated[str | None, typer.Option(help="one sandbox's records")] = None,
    action: Annotated[str | None, typer.Option(help="one action, e.g. exec")] = None,
    every: Annotated[float, typer.Option(min=0.1, help="seconds between asks with -f")] = 1.0,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Print audit records as JSON lines, oldest first (yours; an admin key's: everyone's)."""
    from sandcell.client.audit import Audit, cursor_after

    query: dict[str, Any] = {"sandbox": sandbox, "action": action, "limit": 1000}
    after: str | None = None
    start: float | str = since if since is not None else time.time() - DEFAULT_SINCE_S
    while True:
        with reporting():
            page = Audit.list(
                since=None if after else start, after=after, **query, api_key=api_key, url=url
            )
        for rec in page["records"]:
            typer.echo(json.dumps(rec, sort_keys=True, separators=(",", ":")))
        if page["records"]:
            after = cursor_after(page["records"][-1])
        if page["next"]:
            continue
        if not follow:
            return
        time.sleep(every)


def register(app: typer.Typer) -> None:
    app.add_typer(audit_app, name="audit")
