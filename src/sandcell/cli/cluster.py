"""`sandcell cluster init | issue` (SPEC §18): the cluster CA, and a certificate for each node
and router (sandcell/cluster/trust.py). Nothing here prints a key: each is written 0600, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sandcell.cli.common import fail

cluster_app = typer.Typer(
    help="The cluster's trust: a CA (init), a certificate per node and router (issue).",
    no_args_is_help=True,
)
DirArg = Annotated[
    Path, typer.Argument(metavar="DIR", help="the cluster directory", show_default=False)
]


@cluster_app.command("init")
def init(directory: DirArg) -> None:
    """Make the cluster CA in DIR: ca.pem (for every member) and ca-key.pem (0600, for
    whoever issues). An existing CA is never replaced."""
    from sandcell.cluster.trust import TrustError
    from sandcell.cluster.trust import init as make_ca

    try:
        cert = make_ca(directory)
    except (TrustError, OSError) as exc:
        raise fail(str(exc), 1) from None
    typer.echo(str(cert))


@cluster_app.command("issue")
def issue(
    directory: DirArg,
    node: Annotated[str | None, typer.Option("--node", metavar="NAME", help="for a node")] = None,
    router: Annotated[
        str | None, typer.Option("--router", metavar="NAME", help="for a router")
    ] = None,
    addresses: Annotated[
        list[str] | None,
        typer.Option("--address", metavar="IP", help="an address routers dial (repeatable)"),
    ] = None,
    dns_names: Annotated[
        list[str] | None,
        typer.Option("--dns", metavar="HOST", help="a name routers dial (repeatable)"),
    ] = None,
    days: Annotated[int, typer.Option("--days", min=1, max=825, help="validity in days")] = 365,
) -> None:
    """Issue (or re-issue) the certificate of one node or router, signed by DIR's CA, into
    DIR/nodes/NAME/ or DIR/routers/NAME/: the directory that member's host holds."""
    import datetime

    from sandcell.cluster.trust import Role, TrustError, issue, load_member

    role: Role
    if node is not None and router is None:
        role, name = "node", node
    elif router is not None and node is None:
        role, name = "router", router
    else:
        raise fail("give exactly one of --node NAME or --router NAME", 2)
    try:
        made = issue(
            directory,
            role,
            name,
            addresses or (),
            dns_names or (),
            datetime.timedelta(days=days),
        )
        member = load_member(made, role)
    except (TrustError, OSError) as exc:
        raise fail(str(exc), 1) from None
    typer.echo(f"{made}\t{role} {name}, valid until {member.not_after:%Y-%m-%d %H:%M} UTC")


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
