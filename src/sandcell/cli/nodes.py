"""`sandcell nodes ls` (SPEC §18): the node roster, read from the configured store (the same
`--config` / `--data-dir` as `sandcell serve` and `sandcell keys`), with each node's
liveness as of now."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import typer

from sandcell.cli import ConfigOpt, DataDirOpt, _settings
from sandcell.cli.common import JsonOpt, print_json, print_table

if TYPE_CHECKING:
    from sandcell.store import NodeRecord

nodes_app = typer.Typer(help="The nodes that run cells for routers: ls.", no_args_is_help=True)


def _roster(config: ConfigOpt, data_dir: DataDirOpt) -> list[NodeRecord]:
    import asyncio

    from sandcell.serve import opened_store

    async def listing() -> list[NodeRecord]:
        async with opened_store(_settings(config, data_dir)) as store:
            return await store.list_nodes()

    return asyncio.run(listing())


@nodes_app.command("ls")
def ls(json_out: JsonOpt = False, config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """List the nodes: state, liveness, free of total, labels, version."""
    from sandcell.store.nodes import liveness

    roster, now = _roster(config, data_dir), time.time()
    if json_out:
        print_json([{**n.to_dict(), "liveness": liveness(n, now)} for n in roster])
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("NAME", "ADDRESS", "STATE", "LIVENESS", "CELLS", "MEMORY MB", "CPUS"):
        table.add_column(column, overflow="fold")
    for column in ("DISK MB", "LABELS", "VERSION", "SEEN"):
        table.add_column(column, overflow="fold")
    for n in roster:
        table.add_row(
            n.name,
            n.address,
            n.state,
            liveness(n, now),
            f"{n.free_cells}/{n.cells}",
            f"{n.free_memory_mb}/{n.memory_mb}",
            f"{n.free_cpus:g}/{n.cpus:g}",
            f"{n.free_disk_mb}/{n.disk_mb}",
            ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-",
            n.version,
            f"{max(0.0, now - n.heartbeat_at):.0f}s ago",
        )
    print_table(table)


def register(app: typer.Typer) -> None:
    app.add_typer(nodes_app, name="nodes")
