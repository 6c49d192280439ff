"""The `sandcell` command.

Each command imports what it needs when it runs: the client commands (`run`, `exec`, ...)
never load asyncio, the server or the async SDK (tests/cli/test_lean_imports.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from sandcell.cli.lazy import LazyGroup


class _Commands(LazyGroup):
    """The server commands are defined below; the client commands' modules load on use."""

    homes = {
        **dict.fromkeys(("create", "ls", "exec", "run", "cp", "rm"), "sandboxes"),
        **dict.fromkeys(("url", "network"), "network"),
        **dict.fromkeys(("pause", "resume", "snapshot", "fork", "snapshots"), "persistence"),
        **dict.fromkeys(("ps", "logs", "kill", "stats"), "processes"),
        "code": "code",
        "mcp": "mcp",
        "template": "templates",
        "secrets": "secrets",
        "cluster": "cluster",
        "nodes": "nodes",
        "node": "node",
        "audit": "audit",
    }


app = typer.Typer(
    cls=_Commands,
    help="Disposable, isolated Linux sandboxes for untrusted code.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        from sandcell import __version__

        typer.echo(f"sandcell {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    pass


keys_app = typer.Typer(help="API keys: create (printed once), list, revoke.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="TOML config file", exists=True, dir_okay=False)
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="SANDCELL_DATA_DIR",
        help="store, key file and workspaces [default: $XDG_DATA_HOME/sandcell]",
    ),
]
CleanupOnExitOpt = Annotated[
    bool,
    typer.Option(
        "--cleanup-on-exit",
        help="delete the live sandboxes at shutdown (else they stay for the next start)",
    ),
]


def _settings(config: Path | None, data_dir: Path | None):
    from sandcell.manager.templates import ConfigError
    from sandcell.settings import load_settings

    try:
        return load_settings(config, data_dir)
    except ConfigError as exc:
        typer.echo(f"sandcell: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(show_default="127.0.0.1")] = None,
    port: Annotated[int | None, typer.Option(show_default="8700")] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            envvar="SANDCELL_BACKEND",
            help="local or kubernetes (default: server.backend, else local)",
        ),
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            help="text (for people) or json (one object a line, for log shippers) "
            "[default: server.log_format, else text]"
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error", show_default=True)
    ] = "info",
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="one line per request")
    ] = True,
    cleanup_on_exit: CleanupOnExitOpt = False,
) -> None:
    """Run the router and the manager: local cells by default (no file needed), or pods
    (`--backend kubernetes`, set up by the config's kubernetes table: docs/kubernetes.md).
    SIGTERM or SIGINT stops it gracefully."""
    import asyncio

    import uvloop

    from sandcell.logs import FORMATS, LEVELS
    from sandcell.manager.templates import ConfigError
    from sandcell.serve import ServeOptions
    from sandcell.serve import serve as run_server
    from sandcell.settings import BACKENDS

    settings = _settings(config, data_dir)
    settings.host = host or settings.host
    settings.port = port or settings.port
    settings.backend = backend or settings.backend
    settings.log_format = log_format or settings.log_format
    for name, value, allowed in (
        ("--backend", settings.backend, BACKENDS),
        ("--log-format", settings.log_format, FORMATS),
        ("--log-level", log_level, LEVELS),
    ):
        if value not in allowed:
            typer.echo(f"sandcell: {name} must be one of {list(allowed)}", err=True)
            raise typer.Exit(2)
    options = ServeOptions(config, log_level, access_log, cleanup_on_exit)
    try:
        # uvloop as the loop itself: uvicorn only installs it in Server.run(), not serve().
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run_server(settings, options))
    except ConfigError as exc:  # e.g. no cluster configuration to be found
        typer.echo(f"sandcell: {exc}", err=True)
        raise typer.Exit(2) from None


@keys_app.command("create")
def keys_create(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="sees and manages all sandboxes")] = False,
    e2b: Annotated[
        bool,
        typer.Option("--e2b", help="shaped as an E2B key (e2b_ and 40 hex digits), for e2b SDKs"),
    ] = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create an API key and print it, alone, once: only its hash is stored."""
    import asyncio

    from sandcell.serve import opened_store
    from sandcell.store import ApiKeyExistsError, ApiKeyRecord, hash_api_key, new_api_key

    key = new_api_key(e2b=e2b)

    async def create() -> None:
        from sandcell.audit.operator import record_operator

        async with opened_store(_settings(config, data_dir)) as store:
            touched: dict[str, str | int] = {"key": name, "admin": int(admin)}
            try:
                await store.put_api_key(
                    ApiKeyRecord(name, name, hash_api_key(key), admin, time.time())
                )
            except ApiKeyExistsError:
                await record_operator(store, "key.create", touched, status=409)
                raise
            await record_operator(store, "key.create", touched)

    try:
        asyncio.run(create())
    except ApiKeyExistsError:
        typer.echo(f"sandcell: a key named {name!r} exists (names are never reused)", err=True)
        raise typer.Exit(1) from None
    typer.echo(key)


@keys_app.command("list")
def keys_list(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """List API keys (names and flags; the keys themselves are not stored)."""
    import asyncio

    from sandcell.serve import opened_store

    async def listing():
        async with opened_store(_settings(config, data_dir)) as store:
            return await store.list_api_keys()

    for rec in asyncio.run(listing()):
        flags = ",".join(f for f, on in (("admin", rec.admin), ("revoked", rec.revoked)) if on)
        typer.echo(f"{rec.name}\t{flags or '-'}")


@keys_app.command("revoke")
def keys_revoke(name: str, config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Revoke an API key: it is refused from the next request on."""
    import asyncio

    from sandcell.serve import opened_store

    async def revoke() -> bool:
        from sandcell.audit.operator import record_operator

        async with opened_store(_settings(config, data_dir)) as store:
            done = await store.revoke_api_key(name)
            await record_operator(store, "key.revoke", {"key": name}, 200 if done else 404)
            return done

    if not asyncio.run(revoke()):
        typer.echo(f"sandcell: no key named {name!r}", err=True)
        raise typer.Exit(1)


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
