"""`sandcell mcp [--http HOST:PORT]`: sandboxes as tools for MCP clients (SPEC §15)."""

from __future__ import annotations

from typing import Annotated

import typer

from sandcell.cli.common import ApiKeyOpt, UrlOpt


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter("expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def mcp(
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            metavar="HOST:PORT",
            help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio",
        ),
    ] = None,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            min=1,
            help="--http: end a session (and delete its sandbox) after this many seconds "
            "without a request",
            show_default=True,
        ),
    ] = 1800,
    template: Annotated[
        str, typer.Option(help="template of the session sandboxes", show_default=True)
    ] = "default",
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Serve the Model Context Protocol (stdio by default) so MCP clients (Claude Desktop,
    Claude Code, Cursor, ...) run commands and code in sandboxes. Needs the `mcp` extra."""
    address = _host_port(http) if http is not None else None
    try:
        from sandcell.mcp.server import run
    except ImportError as exc:
        typer.echo(f"sandcell: `sandcell mcp` needs the mcp extra ({exc})", err=True)
        raise typer.Exit(2) from None
    from sandcell.client import ClientConfig

    run(ClientConfig.resolve(url=url, api_key=api_key), template, address, idle_timeout)


def register(app: typer.Typer) -> None:
    app.command()(mcp)
