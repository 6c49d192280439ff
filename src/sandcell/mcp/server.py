"""The MCP server of `sandcell mcp`: stdio (one session, the client's) or streamable HTTP."""

from __future__ import annotations

import signal

import anyio
from mcp.server.mcpserver import MCPServer

from sandcell.client import ClientConfig
from sandcell.mcp import tools
from sandcell.mcp.session import SessionSandboxes, session_sandboxes

INSTRUCTIONS = """\
Tools to run code in isolated, disposable Linux sandboxes (sandcell). Without a sandbox_id,
every tool works in this session's own sandbox: created on first use, kept between calls
(files, run_code state), deleted when the session ends. Paths are relative to the sandbox's
workspace. Use create_sandbox only for a second sandbox or another template."""


def build_server(config: ClientConfig, template: str) -> MCPServer[SessionSandboxes]:
    server: MCPServer[SessionSandboxes] = MCPServer(
        "sandcell",
        instructions=INSTRUCTIONS,
        lifespan=lambda _app: session_sandboxes(config, template),
        log_level="WARNING",  # stdout is the protocol's under stdio; logs go to stderr
    )
    tools.register(server)
    return server


def run(
    config: ClientConfig, template: str, http: tuple[str, int] | None, idle_timeout_s: float
) -> None:
    """Serve until the client leaves (stdio), or SIGINT/SIGTERM; session sandboxes die then."""
    server = build_server(config, template)

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_cancel_on_signal, tasks.cancel_scope)
            if http is None:
                await server.run_stdio_async()
            else:
                host, port = http
                await server.run_streamable_http_async(
                    host=host, port=port, session_idle_timeout=idle_timeout_s
                )
            tasks.cancel_scope.cancel()

    anyio.run(main)


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    # A signal cancels the serving task, so the lifespan's cleanup runs (the default SIGTERM
    # action would end the process with the session sandboxes still alive).
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return
