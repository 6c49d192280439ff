"""A throw-away venv for packages that cannot share the test venv (another e2b pin, a
conflicting dependency), and a script run in it against the façade."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

INSTALL_TIMEOUT_S = 600


def run_in_venv(
    where: Path, requirements: list[str], script: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    return subprocess.run(
        [python, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
