"""e2b 2.20.3, the version crewai-tools pins, in a throw-away venv of its own: after
`Sandbox.connect()` it calls envd without `E2b-Sandbox-Id`, and the façade routes those calls
by their access token, which names its sandbox (tokens.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compat.e2b.venvs import run_in_venv

pytestmark = pytest.mark.slow
E2B_220 = "e2b==2.20.3"
SCRIPT = """
from e2b import Sandbox

made = Sandbox.create(timeout=120)
try:
    made.files.write("/home/user/crew.txt", "from crewai")
    sbx = Sandbox.connect(made.sandbox_id)
    assert sbx.commands.run("echo $((6 * 7))").stdout == "42\\n"
    assert sbx.files.read("/home/user/crew.txt") == "from crewai"
finally:
    made.kill()
print("ok")
"""


@pytest.mark.timeout(900)
def test_e2b_2_20_after_connect(tmp_path: Path, e2b_env: dict[str, str]) -> None:
    done = run_in_venv(tmp_path / "venv", [E2B_220], SCRIPT, e2b_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "ok"
