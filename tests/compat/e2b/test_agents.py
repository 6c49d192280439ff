"""Agent frameworks' E2B executors on sandcell, driven directly: no model is called."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from smolagents.default_tools import FinalAnswerTool
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import E2BExecutor

from compat.e2b.venvs import run_in_venv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def executor() -> Iterator[E2BExecutor]:
    # `base`: sandcell's host-system template, whose python has what the tool code imports.
    made = E2BExecutor(additional_imports=[], logger=AgentLogger(LogLevel.ERROR), template="base")
    made.send_tools({"final_answer": FinalAnswerTool()})
    yield made
    made.cleanup()


def test_smolagents_state_logs_and_final_answer(executor: E2BExecutor) -> None:
    executor.send_variables({"base": 20})
    step = executor("doubled = base * 2\nprint('working')\ndoubled")
    assert step.output == "40"
    assert "working" in step.logs
    final = executor("final_answer(doubled + 2)")
    assert final.is_final_answer
    assert final.output == 42


# openai-agents pins websockets<17 (sandcell pins 17.4) and, in its e2b extra, e2b==2.31.0,
# which accepts only `e2b_<hex>` keys: a venv of its own, and the key hex-encoded.
OPENAI_AGENTS = "openai-agents[e2b]==0.24.0"
SANDBOX_SESSION = """
import asyncio, io
from pathlib import Path
from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions

async def main():
    options = E2BSandboxClientOptions(sandbox_type="e2b", template="base", on_timeout="kill")
    session = await E2BSandboxClient().create(options=options)
    async with session:
        hello = await session.exec("echo hello from $(pwd)")
        assert (hello.exit_code, hello.stdout) == (0, b"hello from /workspace\\n"), hello
        await session.write(Path("/workspace/notes.txt"), io.BytesIO(b"agent notes"))
        assert (await session.read(Path("/workspace/notes.txt"))).read() == b"agent notes"
        assert [e.path for e in await session.ls(Path("/workspace"))] == ["/workspace/notes.txt"]
        assert (await session.exec("exit 3")).exit_code == 3
    print("ok")

asyncio.run(main())
"""


@pytest.mark.timeout(900)
def test_openai_agents_e2b_sandbox(tmp_path: Path, e2b_env: dict[str, str]) -> None:
    env = {**e2b_env, "E2B_API_KEY": "e2b_" + e2b_env["E2B_API_KEY"].encode().hex()}
    done = run_in_venv(tmp_path / "venv", [OPENAI_AGENTS], SANDBOX_SESSION, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
