"""`sandcell --version`: one line, the installed package's version, before any command."""

from __future__ import annotations

import importlib.metadata
import subprocess

from support.server import sandcell_bin


def test_version_prints_the_installed_version():
    done = subprocess.run([sandcell_bin(), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sandcell {importlib.metadata.version('sandcell')}\n"
    assert done.stderr == ""


def test_version_is_listed_in_the_help():
    done = subprocess.run([sandcell_bin(), "--help"], capture_output=True, text=True, timeout=60)
    assert "--version" in done.stdout
