"""examples/e2b_unmodified.py runs as a user would run it, with only the three variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "e2b_unmodified.py"


def test_unmodified_snippet(e2b_env: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")} | e2b_env
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["3 lines", "sum of squares: 50", "chart: png"]
