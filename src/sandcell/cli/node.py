"""`sandcell node` (SPEC §18): run this host's cells for the cluster's routers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sandcell.cli import CleanupOnExitOpt, ConfigOpt, DataDirOpt, _settings


def node(
    member: Annotated[
        Path,
        typer.Option(
            "--member",
            envvar="SANDCELL_NODE_DIR",
            help="this node's directory from `sandcell cluster issue --node` (ca.pem, cert.pem, "
            "key.pem)",
            file_okay=False,
        ),
    ],
    host: Annotated[str, typer.Option(help="address the node API binds")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port of the node API (0: any free one)")] = 8701,
    advertise: Annotated[
        str | None,
        typer.Option(
            help="host:port routers dial, as the certificate names it [default: host:port]"
        ),
    ] = None,
    cells: Annotated[int, typer.Option(min=0, help="how many sandboxes this node takes")] = 64,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="KEY=VALUE, repeatable: placement labels")
    ] = None,
    cleanup_on_exit: CleanupOnExitOpt = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error", show_default=True)
    ] = "info",
) -> None:
    """Run a node: the manager, local cells, warm pools and egress of this host, behind a node
    API that answers only the cluster's routers (mutual TLS). It registers in the store's
    roster and heartbeats; SIGTERM or SIGINT stops it and takes it out of the roster."""
    import asyncio

    import uvloop

    from sandcell.logs import LEVELS
    from sandcell.node.run import NodeOptions, run_node

    labels: dict[str, str] = {}
    for pair in label or []:
        key, sep, value = pair.partition("=")
        if not sep:
            typer.echo(f"sandcell: --label takes KEY=VALUE, not {pair!r}", err=True)
            raise typer.Exit(2)
        labels[key] = value
    if log_level not in LEVELS:
        typer.echo(f"sandcell: --log-level must be one of {list(LEVELS)}", err=True)
        raise typer.Exit(2)
    settings = _settings(config, data_dir)
    options = NodeOptions(
        member, host, port, advertise or "", cells, labels, log_level, cleanup_on_exit
    )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run_node(settings, options))


def register(app: typer.Typer) -> None:
    app.command("node")(node)
