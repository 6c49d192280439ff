"""Reliability suite fixtures: servers that always go away, and the figures it reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability.harness import Servers, servers

FIGURES: dict[str, dict] = {}


@pytest.fixture
def figures() -> dict[str, dict]:
    """Numbers a test proves (load held, faults survived, inputs tried), printed at the end."""
    return FIGURES


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Servers]:
    """`sandcell serve` processes of one test: stopped, and their cells destroyed, after it."""
    with servers(tmp_path) as s:
        yield s


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("sandcell reliability figures")
    for name, values in FIGURES.items():
        terminalreporter.write_line(f"{name}: {json.dumps(values, sort_keys=True)}")
