"""The official MCP client driving `sandcell mcp`: what every transport's test checks."""

from __future__ import annotations

import base64
import time

from mcp import ClientSession
from mcp_types import CallToolResult, ImageContent, TextContent

from support.server import RunningServer

TOOLS = {
    "run_command",
    "run_code",
    "read_file",
    "write_file",
    "list_files",
    "create_sandbox",
    "list_sandboxes",
    "kill_sandbox",
    "get_preview_url",
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHART = "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()"


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def call(session: ClientSession, name: str, **arguments: object) -> CallToolResult:
    return await session.call_tool(name, arguments)


async def check_tool_list(session: ClientSession) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():  # what a model reads: a description and typed arguments
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.input_schema["type"] == "object"
        for prop in tool.input_schema.get("properties", {}).values():
            assert "description" in prop or "anyOf" in prop, (tool.name, prop)
    assert tools["run_command"].input_schema["required"] == ["command"]
    assert tools["run_code"].input_schema["properties"]["language"]["enum"] == ["python", "bash"]


async def exercise_session_sandbox(session: ClientSession) -> None:
    """Every tool that works in the session sandbox, a chart, and failures as error results."""
    echo = await call(session, "run_command", command="echo hi; echo oops >&2")
    assert not echo.is_error and "hi" in text(echo) and "oops" in text(echo)
    assert echo.structured_content["exit_code"] == 0
    failed = await call(session, "run_command", command="exit 3")
    assert failed.is_error and "exit code 3" in text(failed)
    written = await call(session, "write_file", path="notes/a.txt", content="hello")
    assert not written.is_error and '"size": 5' in text(written)
    read = await call(session, "read_file", path="notes/a.txt")
    assert text(read) == "hello"
    listing = await call(session, "list_files", path="notes")
    assert "a.txt" in text(listing)
    missing = await call(session, "read_file", path="nope.txt")
    assert missing.is_error and "FILE_NOT_FOUND" in text(missing)
    escape = await call(session, "read_file", path="../../etc/passwd")
    assert escape.is_error
    state = await call(session, "run_code", code="x = 41")
    assert not state.is_error
    answer = await call(session, "run_code", code="x + 1")
    assert text(answer) == "42"
    chart = await call(session, "run_code", code=CHART, timeout_s=120)
    (image,) = [c for c in chart.content if isinstance(c, ImageContent)]
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(PNG_SIGNATURE)
    boom = await call(session, "run_code", code="1 / 0")
    assert boom.is_error and "ZeroDivisionError" in text(boom)
    bad_args = await call(session, "run_command", command="true", timeout_s=-1)
    assert bad_args.is_error
    still = await call(session, "run_command", command="cat notes/a.txt")
    assert text(still).endswith("hello")  # the server lived through every failure


async def exercise_named_sandboxes(session: ClientSession) -> None:
    created = await call(session, "create_sandbox", metadata={"purpose": "test"})
    assert not created.is_error, text(created)
    sandbox_id = created.structured_content["id"]
    listed = await call(session, "list_sandboxes")
    assert sandbox_id in text(listed)
    ran = await call(session, "run_command", command="pwd", sandbox_id=sandbox_id)
    assert not ran.is_error
    url = await call(session, "get_preview_url", port=8080, sandbox_id=sandbox_id)
    assert not url.is_error and "/p/" in url.structured_content["url"]
    killed = await call(session, "kill_sandbox", sandbox_id=sandbox_id)
    assert killed.structured_content == {"sandbox_id": sandbox_id, "killed": True}
    gone = await call(session, "run_command", command="true", sandbox_id=sandbox_id)
    assert gone.is_error and "SANDBOX_NOT_FOUND" in text(gone)


def session_sandboxes(server: RunningServer, key: str) -> list[str]:
    with server.client(key) as http:
        items = http.get("/v1/sandboxes").raise_for_status().json()["sandboxes"]
    return [s["id"] for s in items if s["metadata"].get("created_by") == "sandcell-mcp"]


def wait_gone(server: RunningServer, key: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while session_sandboxes(server, key):
        assert time.monotonic() < deadline, "the session sandbox outlived its session"
        time.sleep(0.2)
