"""Throw-away venvs for packages that cannot share the test venv (another e2b pin, a
conflicting dependency), and scripts run in them against the façade.

uv builds them (crewai-tools with its e2b extra: about 4 s, where pip takes a minute and a
half), each once per test session under the session's tmp, named by a hash of its
requirements, so the tests that share a row share its venv and nothing outlives the session.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300
UV = Path(sys.executable).with_name("uv")  # from the dev extras
# The venvs run the test venv's own Python, which uv is never to fetch; uv trusts the
# system's certificates, as pip does here.
UV_ENV = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NATIVE_TLS": "1"}


def make_venv(where: Path, requirements: Sequence[str]) -> Path:
    """A venv at `where` holding `requirements`; returns its python."""
    python = where / "bin" / "python"
    subprocess.run(
        [UV, "venv", "--quiet", "--python", sys.executable, where],
        check=True,
        env=UV_ENV,
        timeout=60,
    )
    subprocess.run(
        [UV, "pip", "install", "--quiet", "--python", python, *requirements],
        check=True,
        env=UV_ENV,
        timeout=INSTALL_TIMEOUT_S,
    )
    return python


def session_venv(factory: pytest.TempPathFactory, requirements: Sequence[str]) -> Path:
    """The session's venv for `requirements`, made on first use; returns its python."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    where = factory.getbasetemp() / "venvs" / key
    python = where / "bin" / "python"
    done = where / "installed"
    if not done.exists():
        shutil.rmtree(where, ignore_errors=True)  # one a failed install left half made
        make_venv(where, requirements)
        done.write_text("\n".join(requirements))
    return python


def hex_key(env: dict[str, str]) -> dict[str, str]:
    """`env` with its sandcell key in the form e2b_<hex>, which the façade decodes
    (docs/e2b.md), for SDKs that refuse any other (e2b 2.2x-2.4x)."""
    return {**env, "E2B_API_KEY": "e2b_" + env["E2B_API_KEY"].encode().hex()}


def run_python(
    python: Path, args: Sequence[str | Path], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`python ARGS...` with this process's environment, its E2B variables those of `env`."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    return subprocess.run(
        [python, *args],
        env={**kept, **env},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
