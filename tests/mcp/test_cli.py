"""`sandcell mcp`'s command line, and the MCP SDK staying out of everything else."""

from __future__ import annotations

import subprocess
import sys

from support.server import sandcell_bin


def test_bad_http_address_is_a_usage_error():
    r = subprocess.run(
        [sandcell_bin(), "mcp", "--http", "8765"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "HOST:PORT" in r.stderr


def test_sdk_cli_and_daemon_do_not_import_mcp():
    code = (
        "import sys, sandcell, sandcell.cli, sandcell.daemon.http.app;"
        "print([m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
