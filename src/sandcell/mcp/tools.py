"""The MCP tools (SPEC §15): what a model reads (names, argument schemas, descriptions) and
how each call becomes SDK calls. A sandcell error becomes an MCP error result with its code
and message, never a failure of the server."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, cast

from mcp.server.connection import Connection
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import Field

from sandcell.client import AsyncSandbox, CommandResult, Execution, SandcellError
from sandcell.mcp.session import STATE_KEY, NoSessionError, SessionSandboxes

SandboxId = Annotated[
    str | None,
    Field(
        description="The sandbox to use (an id from create_sandbox or list_sandboxes). Leave it "
        "out to use this session's own sandbox, created on first use and deleted when the "
        "session ends."
    ),
]
Path = Annotated[
    str,
    Field(description="A path relative to the sandbox's workspace directory, e.g. 'data/a.csv'."),
]
IMAGE_MIMES = {"png": "image/png", "jpeg": "image/jpeg"}
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


@contextlib.asynccontextmanager
async def _sandbox(ctx: Context, sandbox_id: str | None) -> AsyncIterator[AsyncSandbox]:
    """The sandbox a call works in, with sandcell's errors turned into tool errors."""
    sessions = _sessions(ctx)
    with _tool_errors():
        if sandbox_id is None:
            yield await sessions.for_connection(_connection(ctx))
            return
        sbx = await AsyncSandbox.connect(sandbox_id, config=sessions.config)
        try:
            yield sbx
        finally:
            await sbx.close()


def _sessions(ctx: Context) -> SessionSandboxes:
    return cast(SessionSandboxes, ctx.request_context.lifespan_context)


def _connection(ctx: Context) -> Connection:
    # The SDK (pinned exactly) gives handlers no public path to the connection, whose state
    # and exit stack are what make a sandbox live exactly as long as its session.
    return ctx.request_context.session._connection


@contextlib.contextmanager
def _tool_errors() -> Any:
    try:
        yield
    except SandcellError as exc:
        raise ToolError(str(exc)) from exc  # "SANDBOX_NOT_FOUND: ..." for the model to act on
    except NoSessionError as exc:
        raise ToolError(str(exc)) from exc


def _text(text: str) -> TextContent:
    return TextContent(type="text", text=text)


def command_result(result: CommandResult) -> CallToolResult:
    """Exit code and output; a non-zero exit is an error result so the model notices it."""
    parts = [f"exit code {result.exit_code}" + (" (timed out)" if result.timed_out else "")]
    parts += [f"--- {name} ---\n{text}" for name, text in _streams(result) if text]
    return CallToolResult(
        content=[_text("\n".join(parts))],
        structured_content=result.to_dict(),
        is_error=result.exit_code != 0,
    )


def _streams(result: CommandResult) -> list[tuple[str, str]]:
    return [("stdout", result.stdout), ("stderr", result.stderr)]


def execution_result(execution: Execution) -> CallToolResult:
    """Printed output as text, each rich result as an image or its richest text form."""
    content: list[ContentBlock] = []
    if execution.logs.stdout:
        content.append(_text("".join(execution.logs.stdout)))
    if execution.logs.stderr:
        content.append(_text("--- stderr ---\n" + "".join(execution.logs.stderr)))
    for result in execution.results:
        images = [(fmt, mime) for fmt, mime in IMAGE_MIMES.items() if result[fmt]]
        content += [ImageContent(type="image", data=result[f], mime_type=m) for f, m in images]
        text = result.markdown or result.text
        if not images and text is not None:
            content.append(_text(text))
    if execution.error is not None:
        error = execution.error
        content.append(_text(f"{error.name}: {error.value}\n{error.traceback}"))
    return CallToolResult(content=content or [_text("(no output)")], is_error=bool(execution.error))


def register(server: MCPServer[SessionSandboxes]) -> None:
    """Adds every tool to `server`."""
    for tool, hints in (
        (run_command, None),
        (run_code, None),
        (read_file, READ_ONLY),
        (write_file, None),
        (list_files, READ_ONLY),
        (create_sandbox, None),
        (list_sandboxes, READ_ONLY),
        (kill_sandbox, ToolAnnotations(destructive_hint=True)),
        (get_preview_url, None),
    ):
        server.add_tool(tool, annotations=hints)


async def run_command(
    ctx: Context,
    command: Annotated[str, Field(description="A shell command line, run with /bin/sh -c.")],
    sandbox_id: SandboxId = None,
    cwd: Annotated[str | None, Field(description="Working directory, workspace-relative.")] = None,
    env: Annotated[dict[str, str] | None, Field(description="Extra environment variables.")] = None,
    timeout_s: Annotated[
        float, Field(gt=0, le=3600, description="Kill the command after this many seconds.")
    ] = 60,
) -> CallToolResult:
    """Run a shell command in an isolated Linux sandbox (no network unless the sandbox's policy
    allows it) and return its exit code, stdout and stderr. Files persist in the workspace
    between calls; each command starts a fresh shell. A non-zero exit is an error result."""
    async with _sandbox(ctx, sandbox_id) as sbx:
        result = await sbx.commands.run(command, timeout=timeout_s, env=env, cwd=cwd)
    return command_result(result)


async def run_code(
    ctx: Context,
    code: Annotated[str, Field(description="The code to run.")],
    language: Annotated[
        Literal["python", "bash"], Field(description="python (IPython) or bash.")
    ] = "python",
    sandbox_id: SandboxId = None,
    timeout_s: Annotated[
        float, Field(gt=0, le=3600, description="Interrupt the run after this many seconds.")
    ] = 300,
) -> CallToolResult:
    """Run code in a stateful interpreter in the sandbox, like a Jupyter cell: variables,
    imports and functions persist between calls. Returns what it prints, the value of the last
    expression, and charts (matplotlib figures come back as images). An exception in the code
    is an error result carrying its traceback."""
    async with _sandbox(ctx, sandbox_id) as sbx:
        execution = await sbx.run_code(code, language=language, timeout=timeout_s)
    return execution_result(execution)


async def read_file(ctx: Context, path: Path, sandbox_id: SandboxId = None) -> list[ContentBlock]:
    """Read a file from the sandbox's workspace: text as text, a PNG or JPEG as an image,
    other binary content as base64."""
    async with _sandbox(ctx, sandbox_id) as sbx:
        data = await sbx.files.read(path)
    image = _image_mime(data)
    if image is not None:
        return [ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=image)]
    try:
        return [_text(data.decode("utf-8"))]
    except UnicodeDecodeError:
        encoded = base64.b64encode(data).decode()
        return [_text(f"(binary, {len(data)} bytes, base64)\n{encoded}")]


def _image_mime(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    return None


async def write_file(
    ctx: Context,
    path: Path,
    content: Annotated[str, Field(description="The file's new content (UTF-8 text).")],
    sandbox_id: SandboxId = None,
) -> dict[str, Any]:
    """Create or replace a text file in the sandbox's workspace (parent directories are
    created). Returns the file's entry."""
    async with _sandbox(ctx, sandbox_id) as sbx:
        entry = await sbx.files.write(path, content)
    return entry.to_dict()


async def list_files(
    ctx: Context,
    path: Annotated[str, Field(description="A directory, workspace-relative.")] = ".",
    depth: Annotated[int, Field(ge=1, le=10, description="How many levels to descend.")] = 1,
    sandbox_id: SandboxId = None,
) -> list[dict[str, Any]]:
    """List a directory of the sandbox's workspace: name, path, type (file, dir, symlink),
    size, mode and modification time of each entry."""
    async with _sandbox(ctx, sandbox_id) as sbx:
        entries = await sbx.files.list(path, depth=depth)
    return [entry.to_dict() for entry in entries]


async def create_sandbox(
    ctx: Context,
    template: Annotated[
        str,
        Field(description="The sandcell template, e.g. 'default' or 'code-interpreter'."),
    ] = "default",
    idle_timeout_s: Annotated[
        int | None,
        Field(gt=0, description="Delete the sandbox after this long without a request."),
    ] = None,
    metadata: Annotated[
        dict[str, str] | None, Field(description="Labels to find it by later.")
    ] = None,
    secrets: Annotated[
        list[str] | None,
        Field(
            description="Names of the API key's secrets (set with `sandcell secrets set`): each "
            "is an environment variable holding a placeholder, which the egress proxy replaces "
            "with the real value towards the secret's hosts; the sandbox never sees the value."
        ),
    ] = None,
) -> dict[str, Any]:
    """Create a new sandbox and return its id, to pass as sandbox_id to the other tools. It
    outlives this session: delete it with kill_sandbox (or it expires when idle). Only needed
    for a second sandbox or another template: the tools have a session sandbox already."""
    sessions = _sessions(ctx)
    with _tool_errors():
        sbx = await AsyncSandbox.create(
            template=template,
            timeout=idle_timeout_s,
            metadata=metadata,
            secrets=secrets or (),
            config=sessions.config,
        )
    await sbx.close()
    return sbx.last_info.to_dict()


async def list_sandboxes(ctx: Context) -> list[dict[str, Any]]:
    """List the sandboxes this API key owns: id, template, state, times and metadata."""
    sessions = _sessions(ctx)
    with _tool_errors():
        infos = await AsyncSandbox.list(config=sessions.config)
    return [info.to_dict() for info in infos]


async def kill_sandbox(
    ctx: Context,
    sandbox_id: Annotated[str, Field(description="The sandbox to delete.")],
) -> dict[str, Any]:
    """Delete a sandbox and everything in it. Killing this session's sandbox is allowed: the
    next call without sandbox_id then gets a fresh one."""
    connection = _connection(ctx)
    session_sbx = connection.state.get(STATE_KEY)
    if session_sbx is not None and session_sbx.id == sandbox_id:
        del connection.state[STATE_KEY]
    async with _sandbox(ctx, sandbox_id) as sbx:
        killed = await sbx.kill()
    return {"sandbox_id": sandbox_id, "killed": killed}


async def get_preview_url(
    ctx: Context,
    port: Annotated[int, Field(ge=1, le=65535, description="The port a server listens on.")],
    sandbox_id: SandboxId = None,
    expires_in_s: Annotated[
        int, Field(gt=0, le=7 * 86400, description="How long the URL works.")
    ] = 3600,
) -> dict[str, str]:
    """A URL that opens what the sandbox serves on `port` (a web app started with run_command
    in the background, listening on 0.0.0.0 or 127.0.0.1). It needs no key: anyone with it can
    reach that port until it expires or the sandbox is deleted."""
    async with _sandbox(ctx, sandbox_id) as sbx:
        url = await sbx.get_url(port, expires_in_s=expires_in_s)
    return {"url": url}
