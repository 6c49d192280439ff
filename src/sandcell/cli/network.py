"""`sandcell url ID PORT` and `sandcell network ID`: exposed ports and live egress changes."""

from __future__ import annotations

from typing import Annotated

import typer

from sandcell.cli.common import (
    AllowOpt,
    ApiKeyOpt,
    DenyOpt,
    EgressOpt,
    IdArg,
    JsonOpt,
    UrlOpt,
    connected,
    print_json,
    reporting,
)


def url(
    sandbox_id: IdArg,
    port: Annotated[int, typer.Argument(min=1, max=65535, show_default=False)],
    expires_in: Annotated[
        int, typer.Option("--expires-in", min=1, help="seconds the URL stays valid")
    ] = 3600,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Print a preview URL for what sandbox ID serves on PORT (no API key needed to open it)."""
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        typer.echo(sbx.get_url(port, expires_in_s=expires_in))


def network(
    sandbox_id: IdArg,
    egress: EgressOpt = None,
    allow: AllowOpt = None,
    deny: DenyOpt = None,
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Replace sandbox ID's egress policy (new connections follow it at once)."""
    with reporting():
        from sandcell.client.network import network_policy

        with connected(sandbox_id, url, api_key) as sbx:
            info = sbx.set_network(network_policy(egress, allow or (), deny or ()))
    if json_out:
        print_json(info.network)
    else:
        typer.echo(f"{info.network.get('egress')}: allow {info.network.get('allow')}")


def register(app: typer.Typer) -> None:
    app.command()(url)
    app.command()(network)
