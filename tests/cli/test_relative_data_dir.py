"""`--data-dir` may be relative: it is taken from the working directory (it once became the
host part of the SQLite URL, and every store command failed with a traceback)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.server import sandcell_bin


def test_store_commands_take_a_relative_data_dir(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sandcell_bin(), *args, "--data-dir", "d"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = run("keys", "create", "ci")
    assert made.returncode == 0, made.stderr
    listed = run("keys", "list")
    assert (listed.returncode, listed.stdout) == (0, "ci\t-\n"), listed.stderr
    assert (tmp_path / "d" / "sandcell.db").exists()
