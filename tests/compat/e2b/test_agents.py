"""smolagents' E2B executor on sandcell, driven directly: no model is called (the other
frameworks, in venvs of their own or not, are in test_frameworks.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from smolagents.default_tools import FinalAnswerTool
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import E2BExecutor

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
