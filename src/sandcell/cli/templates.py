"""`sandcell template ls | build | rm` (SPEC §12), over the SDK, against a router.

`build` shows a progress bar over the build's steps with the log scrolling above it; errors
print one line on stderr (`sandcell: CODE: message`) and, for a failed step, the last lines
of its log.
"""

from __future__ import annotations

import time
from typing import Any

import typer

from sandcell.cli.common import (
    ApiKeyOpt,
    JsonOpt,
    UrlOpt,
    print_json,
    print_table,
    reporting,
)

template_app = typer.Typer(
    help="Templates and their images: list, build, delete.", no_args_is_help=True
)


@template_app.command("ls")
def ls(json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """List templates with their image's base and state."""
    with reporting():
        from sandcell.client.templates import Templates

        templates = Templates.list(api_key=api_key, url=url)
    if json_out:
        print_json(templates)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("NAME", "BASE", "STATE", "DIGEST", "SIZE", "BUILT"):
        # On a narrow terminal only BASE (an archive's path can be long) folds; the others
        # keep their width, so no column is squeezed to nothing.
        table.add_column(column, no_wrap=column != "BASE", overflow="fold")
    for t in templates:
        image: dict[str, Any] = t.get("image") or {}
        table.add_row(
            str(t.get("name")),
            str(image.get("base", "host")),
            str(image.get("state", "-")),
            (image.get("digest") or "-")[:12],
            _size(image.get("size_bytes")),
            _when(image.get("built_at")),
        )
    print_table(table)


@template_app.command("build")
def build(
    name: str, json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None
) -> None:
    """Build a template's image (admin key); a no-op when nothing changed."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sandcell.client.templates import BuildFailedError, Templates

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"building {name}", total=None)

        def show(event: dict[str, Any]) -> None:
            if event.get("event") == "step":
                step = f"[{event.get('index')}/{event.get('total')}] {event.get('step')}"
                progress.update(task, description=step, total=event.get("total"))
                progress.update(task, completed=int(event.get("index") or 1) - 1)
            elif event.get("event") == "log":
                progress.console.print(str(event.get("line", "")), markup=False, highlight=False)

        with reporting():
            try:
                image = Templates.build(name, on_event=show, api_key=api_key, url=url)
            except BuildFailedError as exc:  # its log's last lines, then the one-line error
                for line in exc.details.get("log", []):
                    console.print(str(line), markup=False, highlight=False)
                raise
    if json_out:
        print_json(image)
    else:
        size = _size(image.get("size_bytes"))
        typer.echo(f"{name}: {image.get('state')} {image.get('digest')} {size}")


@template_app.command("rm")
def rm(name: str, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Delete a template's image (refused while sandboxes of it run)."""
    with reporting():
        from sandcell.client.templates import Templates

        removed = Templates.remove(name, api_key=api_key, url=url)
    typer.echo(f"{name}: {'image deleted' if removed else 'no image to delete'}")


def _size(size: int | None) -> str:
    if not isinstance(size, int):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return "-"


def _when(ts: float | None) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def register(app: typer.Typer) -> None:
    app.add_typer(template_app, name="template")
