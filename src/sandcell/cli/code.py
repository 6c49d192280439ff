"""`sandcell code ID [-l python] [-c CODE | FILE]`: run code in a sandbox's code context.

Output streams as the code prints; each result is printed as text, and images (PNG, JPEG,
SVG) are saved to files whose names are printed on stderr. Exit 0, 1 when the code raised
(its traceback on stderr), 125 when sandcell itself failed.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sandcell.cli.common import (
    SANDCELL_FAILED,
    ApiKeyOpt,
    IdArg,
    JsonOpt,
    UrlOpt,
    connected,
    print_json,
    reporting,
    writer,
)

if TYPE_CHECKING:
    from sandcell.client import Execution, Result

IMAGES = {"png": "png", "jpeg": "jpg", "svg": "svg"}


class _ResultPrinter:
    """Prints results as they arrive; images go to numbered files in `out_dir`."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.saved: list[Path] = []

    def __call__(self, result: Result) -> None:
        images = [(fmt, ext) for fmt, ext in IMAGES.items() if result[fmt] is not None]
        for fmt, ext in images:
            self._save(result[fmt], fmt, ext)
        text = result.markdown or result.text
        if text is not None and not images:  # an image's text is only its repr
            typer.echo(text)

    def _save(self, data: str, fmt: str, ext: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"result-{len(self.saved) + 1}.{ext}"
        path.write_bytes(data.encode() if fmt == "svg" else base64.b64decode(data))
        self.saved.append(path)
        typer.echo(f"saved {fmt} to {path}", err=True)


def _source(code: str | None, file: str | None) -> str:
    if code is not None and file is not None:
        raise typer.BadParameter("give -c CODE or FILE, not both")
    if code is not None:
        return code
    if file is None or file == "-":
        if file is None and sys.stdin.isatty():
            raise typer.BadParameter("give -c CODE, a FILE, or code on stdin")
        return sys.stdin.read()
    return Path(file).read_text()


def code(
    sandbox_id: IdArg,
    file: Annotated[
        str | None, typer.Argument(metavar="[FILE]", help="code file ('-' or none: stdin)")
    ] = None,
    source: Annotated[str | None, typer.Option("--code", "-c", help="the code to run")] = None,
    language: Annotated[str, typer.Option("--language", "-l", help="python or bash")] = "python",
    context: Annotated[
        str | None, typer.Option("--context", help="context id (default: the language's own)")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="interrupt the run after SECONDS")
    ] = 300,
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="where images are saved")] = Path(
        "."
    ),
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Run code in a sandbox's stateful context (python with IPython, or bash)."""
    text = _source(source, file)
    options: dict[str, Any] = {"timeout": timeout}
    options["context" if context else "language"] = context or language
    printer = _ResultPrinter(out_dir)
    with reporting(SANDCELL_FAILED), connected(sandbox_id, url, api_key) as sbx:
        execution = _run(sbx, text, options, printer, json_out)
    error = execution.error
    if error is not None:
        if not json_out:
            typer.echo(error.traceback or f"{error.name}: {error.value}", err=True)
        raise typer.Exit(1)


def _run(
    sbx: Any, text: str, options: dict[str, Any], printer: _ResultPrinter, json_out: bool
) -> Execution:
    if json_out:
        execution = sbx.run_code(text, **options)
        print_json(execution.to_dict())
        return execution
    return sbx.run_code(
        text,
        on_stdout=writer(sys.stdout),
        on_stderr=writer(sys.stderr),
        on_result=printer,
        **options,
    )


def register(app: typer.Typer) -> None:
    app.command()(code)
