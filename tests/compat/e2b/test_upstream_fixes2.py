"""What E2B's own SDK tests (tests/compat/e2b/upstream/run.py) expect of the release they
ship with, e2b 2.45.1, driven through that release, unmodified, in a session venv (the
version matrix's, venvs.py)."""

from __future__ import annotations

import pytest

from compat.e2b.venvs import hex_key, run_python, session_venv

pytestmark = pytest.mark.slow
RELEASE = ("e2b==2.45.1",)  # test_matrix.py's row: the venv is shared

# E2B's test_sandbox_killed_during_run, as a script: 2.45's transport (pyqwest) takes only a
# reset for a lost connection, and only then probes the sandbox and names its end.
KILLED_DURING_RUN = """
from e2b import Sandbox, TimeoutException
sbx = Sandbox.create(timeout=60)
handle = sbx.commands.run("sleep 60", background=True)
sbx.kill()
try:
    handle.wait()
except TimeoutException as exc:
    print(exc)
"""


def test_a_command_whose_sandbox_is_killed_names_the_end(
    tmp_path_factory: pytest.TempPathFactory, e2b_env: dict[str, str]
) -> None:
    python = session_venv(tmp_path_factory, RELEASE)
    done = run_python(python, ["-c", KILLED_DURING_RUN], hex_key(e2b_env))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "sandbox was killed or reached its end of life" in done.stdout, done.stdout
