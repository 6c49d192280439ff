"""The examples run against a live server, configured only by SANDCELL_URL/SANDCELL_API_KEY."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from sandcell.client import ClientConfig, Sandbox

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _env(config: ClientConfig) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "SANDCELL_URL": config.url,
        "SANDCELL_API_KEY": config.api_key or "",
    }


def test_data_analysis_uploads_analyses_and_downloads(config: ClientConfig, tmp_path: Path):
    source = tmp_path / "sales.csv"
    with source.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "region", "product", "units", "unit_price"])
        writer.writerows(
            [["d", "north", "a", 2, 1.5], ["d", "south", "b", 5, 2.0], ["d", "north", "a", 1, 2.5]]
        )
    before = {s.id for s in Sandbox.list(config=config)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "data_analysis.py"), str(source), str(tmp_path / "out")],
        env=_env(config),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"north": 5.5' in done.stdout and '"best_seller": "b"' in done.stdout
    rows = list(csv.reader((tmp_path / "out" / "summary.csv").open()))
    assert rows == [["product", "units", "median_price"], ["b", "5", "2.0"], ["a", "3", "2.0"]]
    assert {s.id for s in Sandbox.list(config=config)} == before  # its sandbox is gone


def test_agent_tool_returns_output_errors_and_timeouts_as_data(
    config: ClientConfig, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SANDCELL_URL", config.url)
    monkeypatch.setenv("SANDCELL_API_KEY", config.api_key or "")
    spec = importlib.util.spec_from_file_location("agent_tool", EXAMPLES / "agent_tool.py")
    assert spec is not None and spec.loader is not None
    agent_tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_tool)

    with agent_tool.PythonTool() as tool:
        ok = tool.run_python("print(6 * 7)")
        assert ok == {"ok": True, "exit_code": 0, "stdout": "42\n", "stderr": ""}
        boom = tool.run_python("raise ValueError('bad input')")
        assert not boom["ok"] and "ValueError: bad input" in boom["stderr"]
        slow = tool.run_python("while True: pass", timeout_s=1)
        assert not slow["ok"] and slow["exit_code"] == 124 and "timed out" in slow["error"]
        sandbox_id = tool._sandbox.id
    assert sandbox_id not in [s.id for s in Sandbox.list(config=config)]
