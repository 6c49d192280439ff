"""The `sandcell` command."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Disposable, isolated Linux sandboxes for untrusted code.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command(
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    }
)
def daemon(ctx: typer.Context) -> None:
    """Run the in-cell daemon (see `sandcell daemon --help`)."""
    from sandcell.daemon.server import main as daemon_main

    raise typer.Exit(daemon_main(ctx.args))


@app.command()
def doctor() -> None:
    """Print, layer by layer, what this host can enforce; exit 1 if a default cell cannot run."""
    from rich.console import Console

    from sandcell.cli.doctor import run

    raise typer.Exit(run(Console()))


def main() -> None:
    app()
