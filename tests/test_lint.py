"""The tree stays ruff-clean: lint is part of the suite, so CI enforces it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = Path(sys.executable).with_name("ruff")
    for args in (["check"], ["format", "--check"]):
        r = subprocess.run(
            [str(ruff), *args, "src", "tests", "examples", "bench"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr
