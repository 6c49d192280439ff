"""Agent frameworks' E2B integrations driven without a model, each run as a script by the
venv that holds the framework (test_frameworks.py), against the façade the E2B_* variables
name:

    python framework_flows.py openai_agents
    python framework_flows.py crewai_tools

Each flow is a row of parts run in order, later parts using what earlier ones made; the script
prints one JSON object naming each part "ok" or the traceback that stopped it, so one venv
start (crewai-tools takes seconds to import) answers every test of its framework.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Part = Callable[[dict[str, Any]], None]


def openai_agents() -> dict[str, Part]:
    from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions
    from e2b import Sandbox

    client = E2BSandboxClient()
    notes = Path("/workspace/notes.txt")

    def options(**extra: Any) -> E2BSandboxClientOptions:
        # `base`: sandcell's host-system template. The rest are the SDK's defaults
        # (on_timeout "pause", auto_resume).
        return E2BSandboxClientOptions(sandbox_type="e2b", template="base", **extra)

    async def session(made: dict[str, Any]) -> None:
        session = await client.create(options=options(pause_on_exit=True))
        async with session:
            hello = await session.exec("echo hello")
            assert (hello.exit_code, hello.stdout) == (0, b"hello\n"), vars(hello)
            await session.write(notes, io.BytesIO(b"agent notes"))
            assert (await session.read(notes)).read() == b"agent notes"
            # Its commands run in the manifest root, and see what its files API wrote.
            assert (await session.exec("cat notes.txt")).stdout == b"agent notes"
            assert [e.path for e in await session.ls(Path("/workspace"))] == [str(notes)]
            assert (await session.exec("exit 3")).exit_code == 3
            made["archive"] = (await session.persist_workspace()).read()
        made["state"] = session.state

    async def pause_and_resume(made: dict[str, Any]) -> None:
        state = made["state"]  # the session ended paused (pause_on_exit)
        assert Sandbox.get_info(state.sandbox_id).state.value == "paused"
        resumed = await client.resume(state)
        async with resumed:
            assert resumed.state.sandbox_id == state.sandbox_id  # reconnected, not remade
            assert (await resumed.read(notes)).read() == b"agent notes"
        Sandbox.kill(state.sandbox_id)

    async def hydrate_workspace(made: dict[str, Any]) -> None:
        fresh = await client.create(options=options(on_timeout="kill"))
        async with fresh:
            await fresh.hydrate_workspace(io.BytesIO(made["archive"]))  # via a tar in /tmp
            assert (await fresh.read(notes)).read() == b"agent notes"

    def sync(part: Callable[[dict[str, Any]], Any]) -> Part:
        return lambda made: asyncio.run(part(made))

    return {
        "session": sync(session),
        "pause_and_resume": sync(pause_and_resume),
        "hydrate_workspace": sync(hydrate_workspace),
    }


def crewai_tools() -> dict[str, Part]:
    from crewai_tools import E2BExecTool, E2BFileTool
    from e2b import Sandbox

    home = "/home/user/crew"

    def exec_tool(made: dict[str, Any]) -> None:
        done = E2BExecTool(template="base").run(command="echo $((6 * 7)); echo warn >&2")
        assert (done["exit_code"], done["stdout"], done["stderr"]) == (0, "42\n", "warn\n")

    def file_tool(made: dict[str, Any]) -> None:
        files = E2BFileTool(template="base", persistent=True)
        try:
            assert files.run(action="write", path=f"{home}/a.txt", content="from crewai")
            assert files.run(action="read", path=f"{home}/a.txt")["content"] == "from crewai"
            # Appending to a new file only: to an existing one the tool writes the bytearray
            # e2b 2.20's files.read returns, which that SDK's write refuses (on E2B too).
            files.run(action="append", path=f"{home}/b.txt", content="appended")
            listed = files.run(action="list", path=home)["entries"]
            assert [(e["name"], e["size"]) for e in listed] == [("a.txt", 11), ("b.txt", 8)]
            info = files.run(action="info", path=f"{home}/a.txt")
            assert (info["permissions"], info["owner"]) == ("-rw-r--r--", "user"), info
            files.run(action="delete", path=f"{home}/a.txt")
            assert not files.run(action="exists", path=f"{home}/a.txt")["exists"]
        finally:
            files.close()

    def attached(made: dict[str, Any]) -> None:
        # sandbox_id=: Sandbox.connect, after which e2b 2.20 sends envd calls without
        # E2b-Sandbox-Id (routed by their access token); the tool leaves the sandbox running.
        owned = Sandbox.create(template="base", timeout=120)
        try:
            owned.files.write(f"{home}/owned.txt", "owned")
            tool = E2BExecTool(sandbox_id=owned.sandbox_id)
            assert tool.run(command="echo attached")["stdout"] == "attached\n"
            read = E2BFileTool(sandbox_id=owned.sandbox_id).run(
                action="read", path=f"{home}/owned.txt"
            )
            assert read["content"] == "owned", read
            assert owned.is_running()
        finally:
            owned.kill()

    return {"exec_tool": exec_tool, "file_tool": file_tool, "attached": attached}


def crewai_on_e2b_hosts() -> dict[str, Part]:
    """crewai's E2BPythonTool: e2b-code-interpreter 2.6 sends run_code to
    https://49999-<id>.<E2B_DOMAIN>, and e2b 2.20 its envd calls to https://49983-<id>...
    (no E2B_SANDBOX_URL here): sandcell's TLS listener and preview domain answer both."""
    from crewai_tools import E2BPythonTool

    def python_tool(made: dict[str, Any]) -> None:
        done = E2BPythonTool(template="base").run(code="x = 6 * 7\nprint('hi')\nx")
        assert (done["text"], done["stdout"], done["error"]) == ("42", ["hi\n"], None), done

    return {"python_tool": python_tool}


FLOWS = {
    "openai_agents": openai_agents,
    "crewai_tools": crewai_tools,
    "crewai_on_e2b_hosts": crewai_on_e2b_hosts,
}

if __name__ == "__main__":
    made: dict[str, Any] = {}
    results = {}
    for name, part in FLOWS[sys.argv[1]]().items():
        started = time.monotonic()
        try:
            part(made)
        except Exception:
            results[name] = traceback.format_exc()
        else:
            results[name] = "ok"
        print(f"{name}: {time.monotonic() - started:.1f}s", file=sys.stderr)
    print(json.dumps(results))
