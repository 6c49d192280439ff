"""`sandcell secrets set | ls | rm` (SPEC §17), over the SDK, against a router.

`set` reads the value from stdin or `--from-file`, never from the command line: an argument
is visible to every user of the host (`ps`, /proc/*/cmdline) and kept in shell history, so
there is no option that takes it. One trailing newline (what `echo` and most editors add) is
dropped; the value must not be empty.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from sandcell.cli.common import ApiKeyOpt, JsonOpt, UrlOpt, fail, print_json, print_table, reporting

secrets_app = typer.Typer(
    help="Secrets sandboxes use without seeing them: set (value from stdin), ls, rm.",
    no_args_is_help=True,
)
MAX_READ = 65_536 + 2  # the API's bound, and a trailing newline: more is refused unread


def _read_value(from_file: Path | None) -> str:
    if from_file is None and sys.stdin.isatty():
        typer.echo("value (end with Ctrl-D): ", err=True, nl=False)
    try:
        if from_file is not None:
            with from_file.open("rb") as f:
                raw = f.read(MAX_READ + 1)
        else:
            raw = sys.stdin.buffer.read(MAX_READ + 1)
    except OSError as exc:
        raise fail(f"{from_file}: {exc.strerror or exc}", 1) from None
    if len(raw) > MAX_READ:
        raise fail("the value is longer than 65536 bytes", 1)
    raw = raw.removesuffix(b"\n").removesuffix(b"\r")
    if not raw:
        raise fail("the value is empty (give it on stdin or with --from-file)", 1)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise fail("the value is not UTF-8 text", 1) from None


@secrets_app.command("set")
def set_secret(
    name: Annotated[str, typer.Argument(metavar="NAME", help="e.g. OPENAI_API_KEY")],
    hosts: Annotated[
        list[str],
        typer.Option("--host", metavar="HOST[:PORT]", help="where it may be sent (repeatable)"),
    ],
    places: Annotated[
        list[str] | None,
        typer.Option(
            "--in", metavar="query|body", help="substitute in the query or body too (repeatable)"
        ),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--from-file", metavar="PATH", dir_okay=False, help="read the value here"),
    ] = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Store a secret, or rotate it: the value comes from stdin (or --from-file)."""
    value = _read_value(from_file)
    with reporting():
        from sandcell.client.secrets import Secrets

        wanted = ["headers", *(p for p in places or () if p != "headers")]
        done = Secrets.set(name, value, hosts, wanted, api_key=api_key, url=url)
    typer.echo(f"{done['name']}\t{','.join(done['hosts'])}")


@secrets_app.command("ls")
def ls(json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """List your secrets (names, hosts, where substituted; never the values)."""
    with reporting():
        from sandcell.client.secrets import Secrets

        found = Secrets.list(api_key=api_key, url=url)
    if json_out:
        print_json(found)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("NAME", "HOSTS", "IN", "UPDATED"):
        table.add_column(column, overflow="fold")
    for s in found:
        table.add_row(
            str(s.get("name")),
            ",".join(s.get("hosts") or ()),
            ",".join(s.get("in") or ()),
            str(s.get("updated_at")),
        )
    print_table(table)


@secrets_app.command("rm")
def rm(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete a secret: sandboxes' placeholders for it are refused from then on."""
    with reporting():
        from sandcell.client.secrets import Secrets

        if not Secrets.delete(name, api_key=api_key, url=url):
            raise fail(f"NOT_FOUND: secret {name} not found", 1)


def register(app: typer.Typer) -> None:
    app.add_typer(secrets_app, name="secrets")
