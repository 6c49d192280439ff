"""Start a daemon on a unix socket, run the two-stage init, and run one command through it.

.venv/bin/python examples/daemon_demo.py "uname -a; echo hello from sandcell"
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient


def main(command: str) -> int:
    root = Path(tempfile.mkdtemp(prefix="sandcell-demo-"))
    (root / "workspace").mkdir()
    bootstrap, session = tokens.generate_p256(), tokens.generate_p256()
    sandbox_id = "sbx-demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandcell.daemon", "--uds", str(root / "d.sock")],
        env={
            "SANDCELL_SANDBOX_ID": sandbox_id,
            "SANDCELL_WORKSPACE": str(root / "workspace"),
            "SANDCELL_BOOTSTRAP_PUBLIC_KEY": tokens.public_pem(bootstrap).decode(),
        },
    )
    try:
        with DaemonClient({"uds": str(root / "d.sock")}, sandbox_id, session) as client:
            for _ in range(200):
                try:
                    client.health()
                    break
                except httpx.TransportError:
                    time.sleep(0.02)
            token = tokens.mint_bootstrap_token(bootstrap, sandbox_id, tokens.public_pem(session))
            print("init:", client.init(token).json())
            result = client.exec(command)
            print(result["stdout"], end="")
            print(result["stderr"], end="", file=sys.stderr)
            print(f"exit {result['exit_code']} in {result['duration_s'] * 1000:.1f} ms")
            return result["exit_code"]
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]) or "echo hello from sandcell"))
