"""Client commands: `sandcell create | ls | exec | run | cp | rm`, over the SDK.

Options, connection and error reporting shared with the other client commands are in
`sandcell.cli.common`; `exec` and `run` exit with the command's own exit code, 125 when
sandcell itself failed.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sandcell.cli.common import (
    SANDCELL_FAILED,
    AllowOpt,
    ApiKeyOpt,
    DenyOpt,
    EgressOpt,
    IdArg,
    JsonOpt,
    UrlOpt,
    connected,
    fail,
    print_json,
    print_table,
    reporting,
    writer,
)

if TYPE_CHECKING:
    from rich.progress import Progress

    from sandcell.client import CommandResult, Sandbox

PROGRESS_FROM_BYTES = 4 * 1_048_576
_REMOTE = re.compile(r"(?P<id>[A-Za-z0-9][A-Za-z0-9._-]{0,127}):(?P<path>.*)", re.S)

EnvOpt = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", metavar="K=V", help="environment variable (repeatable)"),
]
TemplateOpt = Annotated[str, typer.Option("--template", "-t", help="sandbox template")]
CmdTimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.001, help="kill the command after SECONDS")
]
CwdOpt = Annotated[str | None, typer.Option("--cwd", help="working directory in the workspace")]
CmdArg = Annotated[
    list[str],
    typer.Argument(
        metavar="-- CMD...",
        help="one word runs with /bin/sh -c (quote it); several words run as argv, no shell",
        show_default=False,
    ),
]


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise fail(f"{what} must look like NAME=VALUE, got {item!r}", 2)
        out[name] = value
    return out


def _command(words: list[str]) -> str | list[str]:
    """One word (typically quoted, with spaces) runs through the shell; several are argv."""
    if not words:
        raise fail("no command given (usage: ... -- CMD...)", 2)
    return words[0] if len(words) == 1 else words


# -- create, ls, rm -------------------------------------------------------------------------


def create(
    template: TemplateOpt = "default",
    timeout: Annotated[
        int | None, typer.Option("--timeout", min=1, help="idle timeout in seconds")
    ] = None,
    lifetime: Annotated[
        int | None, typer.Option("--lifetime", min=1, help="maximum lifetime in seconds")
    ] = None,
    env: EnvOpt = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option("--metadata", "-m", metavar="K=V", help="label (repeatable)"),
    ] = None,
    egress: EgressOpt = None,
    allow: AllowOpt = None,
    deny: DenyOpt = None,
    snapshot: Annotated[
        str | None, typer.Option("--snapshot", help="start on a copy of this snapshot's files")
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            "--secret", metavar="NAME", help="your secret, as a placeholder in $NAME (repeatable)"
        ),
    ] = None,
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Create a sandbox and print its id (`--allow pypi.org` opens egress to that host)."""
    with reporting():
        from sandcell.client import Sandbox
        from sandcell.client.network import network_policy

        wanted = egress is not None or allow or deny
        sbx = Sandbox.create(
            template,
            timeout=timeout,
            lifetime=lifetime,
            env=_pairs(env, "--env"),
            metadata=_pairs(metadata, "--metadata"),
            network=network_policy(egress, allow or (), deny or ()) if wanted else None,
            snapshot=snapshot,
            secrets=secret or (),
            api_key=api_key,
            url=url,
        )
        sbx.close()
    if json_out:
        print_json(sbx.last_info.to_dict())
    else:
        typer.echo(sbx.id)


def ls(json_out: JsonOpt = False, url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """List your sandboxes."""
    with reporting():
        from sandcell.client import Sandbox

        sandboxes = Sandbox.list(api_key=api_key, url=url)
    if json_out:
        print_json([s.to_dict() for s in sandboxes])
        return
    from rich.table import Table

    if not sandboxes:
        typer.echo("no sandboxes", err=True)
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "TEMPLATE", "STATE", "CREATED", "EXPIRES", "IDLE TIMEOUT"):
        table.add_column(column, no_wrap=True)
    for s in sandboxes:
        table.add_row(
            s.id,
            s.template,
            s.state,
            s.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            s.expires_at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{s.idle_timeout_s}s",
        )
    print_table(table)  # through a pipe, an id is never truncated


def rm(
    sandbox_ids: Annotated[list[str], typer.Argument(metavar="ID...", show_default=False)],
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete sandboxes (and everything in them)."""
    failed = False
    for sandbox_id in sandbox_ids:
        try:
            with reporting(), connected(sandbox_id, url, api_key) as sbx:
                if not sbx.kill():  # gone between the two requests
                    from sandcell.client import SandboxNotFoundError

                    raise SandboxNotFoundError(f"sandbox {sandbox_id} not found")
        except typer.Exit:
            failed = True
    if failed:
        raise typer.Exit(1)


# -- exec and run ---------------------------------------------------------------------------


def _run_command(
    sbx: Sandbox, command: str | list[str], options: dict[str, Any], json_out: bool
) -> CommandResult:
    """Streams the output live (or collects it, for --json) and returns the result."""
    if json_out:
        result = sbx.commands.run(command, **options)
        print_json(result.to_dict())
        return result
    return sbx.commands.run(
        command, on_stdout=writer(sys.stdout), on_stderr=writer(sys.stderr), **options
    )


def exec_command(
    sandbox_id: IdArg,
    cmd: CmdArg = None,  # type: ignore[assignment]
    timeout: CmdTimeoutOpt = 60,
    env: EnvOpt = None,
    cwd: CwdOpt = None,
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="keep stdin open (with -t: a terminal)")
    ] = False,
    terminal: Annotated[
        bool, typer.Option("--tty", "-t", help="a terminal (default command: a login shell)")
    ] = False,
) -> None:
    """Run a command in a sandbox, streaming its output; exit with its exit code.

    `-it` opens an interactive terminal, like `docker exec -it`."""
    if interactive or terminal:
        raise typer.Exit(_interactive(sandbox_id, cmd, terminal, env, cwd, url, api_key))
    command, options = _command(cmd), {"timeout": timeout, "env": _pairs(env, "--env"), "cwd": cwd}
    with reporting(SANDCELL_FAILED), connected(sandbox_id, url, api_key) as sbx:
        result = _run_command(sbx, command, options, json_out)
    raise typer.Exit(result.exit_code)


def _interactive(
    sandbox_id: str,
    cmd: list[str] | None,
    terminal: bool,
    env: list[str] | None,
    cwd: str | None,
    url: str | None,
    api_key: str | None,
) -> int:
    command = _command(cmd) if cmd else None
    options = {"env": _pairs(env, "--env"), "cwd": cwd}
    with reporting(SANDCELL_FAILED):
        from sandcell.cli.terminal import interactive

        with connected(sandbox_id, url, api_key) as sbx:
            return interactive(sbx, command, terminal, **options)


class _Interrupts:
    """SIGINT/SIGTERM for `run`: held back while the sandbox is being created or deleted,
    raised as KeyboardInterrupt while the command runs, so the sandbox is always deleted.

    A second signal while held back is raised at once (the user insists).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        self._held = True
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        again = self.received is not None
        self.received = signum
        if not self._held or again:
            raise KeyboardInterrupt

    def release(self) -> None:
        """From now on a signal interrupts; one that came while held back does so now."""
        self._held = False
        if self.received is not None:
            raise KeyboardInterrupt

    def hold(self) -> None:
        self._held = True

    @property
    def exit_code(self) -> int:
        return 128 + (self.received or signal.SIGINT)


def _delete_for_sure(sbx: Sandbox, url: str | None, api_key: str | None) -> None:
    """Kills the throw-away sandbox; if that fails, asks again on a fresh connection (the
    old one may be unusable after an interruption) and is satisfied once it is gone."""
    from sandcell.client import Sandbox, SandboxNotFoundError, SandcellError

    try:
        sbx.kill()
        return
    except SandcellError:
        pass
    finally:
        sbx.close()
    try:
        with contextlib.closing(Sandbox.connect(sbx.id, api_key=api_key, url=url)) as again:
            again.kill()
    except SandboxNotFoundError:
        return


def run(
    cmd: CmdArg,
    template: TemplateOpt = "default",
    timeout: CmdTimeoutOpt = 60,
    env: EnvOpt = None,
    cwd: CwdOpt = None,
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Run a command in a throw-away sandbox: create, run (streaming), delete.

    The sandbox is deleted whatever happens: success, failure, Ctrl-C or SIGTERM.
    """
    command, options = _command(cmd), {"timeout": timeout, "env": _pairs(env, "--env"), "cwd": cwd}
    interrupts = _Interrupts()
    with reporting(SANDCELL_FAILED), interrupts:
        from sandcell.client import Sandbox

        sbx = None
        try:
            sbx = Sandbox.create(template, api_key=api_key, url=url)
            try:
                interrupts.release()
                result = _run_command(sbx, command, options, json_out)
            finally:
                interrupts.hold()
                _delete_for_sure(sbx, url, api_key)
        except KeyboardInterrupt:
            done = "; the sandbox was deleted" if sbx is not None else ""
            raise fail(f"interrupted{done}", interrupts.exit_code) from None
    raise typer.Exit(result.exit_code)


# -- cp -------------------------------------------------------------------------------------


def _remote(arg: str) -> tuple[str, str] | None:
    """`ID:path` (an id has no '/'; write ./a:b for a local file with a colon)."""
    m = _REMOTE.fullmatch(arg)
    return (m["id"], m["path"]) if m else None


class _ProgressBar:
    """A rich progress bar on stderr, only for people (a TTY) and large files."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._progress: Progress | None = None
        self._task: Any = None
        self._enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int | None) -> None:
        if not self._enabled:
            return
        if self._progress is None:
            if (total or 0) < PROGRESS_FROM_BYTES:
                self._enabled = False
                return
            self._start(total)
        assert self._progress is not None
        self._progress.update(self._task, completed=done)

    def _start(self, total: int | None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.label, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _upload(sbx: Sandbox, local: str, remote: str) -> dict[str, Any]:
    if not remote or remote.endswith("/"):
        remote += Path(local).name
    bar = _ProgressBar(f"upload {Path(local).name}")
    try:
        entry = sbx.files.upload(local, remote, progress=bar)
    finally:
        bar.close()
    return {"direction": "upload", "local": local, **entry.to_dict()}


def _download(sbx: Sandbox, remote: str, local: str) -> dict[str, Any]:
    bar = _ProgressBar(f"download {Path(remote).name}")
    try:
        target = sbx.files.download(remote, local, progress=bar)
    finally:
        bar.close()
    return {"direction": "download", "local": str(target), "size": target.stat().st_size}


def cp(
    src: Annotated[str, typer.Argument(metavar="SRC", show_default=False)],
    dst: Annotated[str, typer.Argument(metavar="DST", show_default=False)],
    json_out: JsonOpt = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Copy a file into or out of a sandbox: `cp FILE ID:path` or `cp ID:path FILE`.

    A remote path ending in '/' (or empty) takes the local file's name; a local directory
    as DST receives the file under its remote name.
    """
    remote_src, remote_dst = _remote(src), _remote(dst)
    if (remote_src is None) == (remote_dst is None):
        raise fail("exactly one of SRC and DST must be ID:path", 2)
    sandbox_id, remote_path = remote_src or remote_dst  # type: ignore[misc]
    with reporting(), connected(sandbox_id, url, api_key) as sbx:
        if remote_dst is not None:
            summary = _upload(sbx, src, remote_path)
        else:
            summary = _download(sbx, remote_path, dst)
    if json_out:
        print_json(summary)


def register(app: typer.Typer) -> None:
    """Adds the client commands to the `sandcell` app."""
    app.command()(create)
    app.command()(ls)
    app.command("exec")(exec_command)
    app.command()(run)
    app.command()(cp)
    app.command()(rm)
