"""`sandcell audit verify` (SPEC §20): checks every writer's chain in the configured store (the
same `--config` / `--data-dir` as `sandcell serve`), one finding a line; exit 1 if any."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from sandcell.cli import ConfigOpt, DataDirOpt, _settings

if TYPE_CHECKING:
    from sandcell.audit.verify import Report

audit_app = typer.Typer(help="The audit trail: verify.", no_args_is_help=True)


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


def register(app: typer.Typer) -> None:
    app.add_typer(audit_app, name="audit")
