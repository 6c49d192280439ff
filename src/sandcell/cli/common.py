"""What the client commands share: the options every command takes (`--url`, `--api-key`,
`--json`, the egress policy), the connection to one sandbox, and how they report.

Each command talks to a router (`--url`, env SANDCELL_URL) with an API key (`--api-key`, env
SANDCELL_API_KEY). Errors print one line on stderr, `sandcell: CODE: message`, and exit 1
(125 for `exec`, `run` and `code`, whose other exit codes are the command's own). The SDK is
imported inside the commands, so `sandcell --help` and the server commands never load it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from sandcell.client import Sandbox

SANDCELL_FAILED = 125  # exec/run/code: sandcell itself failed (the command's codes are its own)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="SANDCELL_URL",
        show_envvar=True,
        help="router URL (default http://127.0.0.1:8700)",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="SANDCELL_API_KEY", show_envvar=True, help="API key"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts)")]
IdArg = Annotated[str, typer.Argument(metavar="ID", show_default=False)]
EgressOpt = Annotated[
    str | None,
    typer.Option("--egress", metavar="none|allowlist|open", help="egress policy mode"),
]
AllowOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow", metavar="DEST", help="allowed host, *.suffix, IP or CIDR [:port] (repeatable)"
    ),
]
DenyOpt = Annotated[
    list[str] | None, typer.Option("--deny", metavar="DEST", help="denied destination (repeatable)")
]


def fail(message: str, code: int) -> typer.Exit:
    """`raise fail(...)`: the message on stderr as `sandcell: ...`, then exit `code`."""
    typer.echo(f"sandcell: {message}", err=True)
    return typer.Exit(code)


def describe(exc: Any) -> str:
    """One line for an SDK error: its code, message and the gist of its details."""
    message = exc.message
    errors = exc.details.get("errors") if isinstance(exc.details, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        where = ".".join(str(p) for p in first.get("loc", []))
        message += f" ({where}: {first.get('msg')})" if where else f" ({first.get('msg')})"
    from sandcell.client.errors import AuthenticationError

    if isinstance(exc, AuthenticationError) and not os.environ.get("SANDCELL_API_KEY"):
        message += " (set SANDCELL_API_KEY or pass --api-key)"
    return f"{exc.code}: {message}"


@contextlib.contextmanager
def reporting(failure_code: int = 1) -> Iterator[None]:
    """Turns every failure into one line on stderr and an exit code; never a traceback."""
    from sandcell.client.errors import SandcellError

    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except SandcellError as exc:
        raise fail(describe(exc), failure_code) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise fail(f"{where}{exc.strerror or exc}", failure_code) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
    except Exception as exc:
        if os.environ.get("SANDCELL_DEBUG"):
            raise
        raise fail(f"unexpected error: {type(exc).__name__}: {exc}", failure_code) from None


def connected(sandbox_id: str, url: str | None, api_key: str | None) -> contextlib.closing[Sandbox]:
    """`with connected(...) as sbx:` the sandbox, its client closed after the block (the
    SDK is imported here, by the commands that use it, not by `import sandcell.cli`)."""
    from sandcell.client import Sandbox

    return contextlib.closing(Sandbox.connect(sandbox_id, api_key=api_key, url=url))


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def print_table(table: Table) -> None:
    """A rich table on stdout: fitted to a terminal; through a pipe or into a file no width
    to fit (rich would assume 80 columns and squeeze or drop some), so every row is whole."""
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 1000).print(table)


def writer(stream: Any) -> Callable[[str], None]:
    """A callback that writes text to `stream` as it arrives (flushed: output streams live)."""

    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write
