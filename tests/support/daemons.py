"""Launching a real daemon process on a unix socket, with a workspace of its own."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient

HOST_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "host-aws-secret-do-not-leak",
    "SANDCELL_STORE_KEY": "host-store-key-do-not-leak",
    "SANDCELL_API_KEY": "sc_host-api-key-do-not-leak",
    "DATABASE_URL": "postgres://admin:hunter2@db/prod",
}
ALLOWED_FROM_HOST = {"LANG": "C.UTF-8", "TZ": "Europe/Paris", "PYTHONUTF8": "1"}


@dataclass
class RunningDaemon:
    proc: subprocess.Popen[bytes]
    uds: Path
    workspace: Path
    sandbox_id: str
    bootstrap_key: tokens.PrivateKey
    session_key: tokens.PrivateKey = field(default_factory=tokens.generate_p256)

    def client(self, session_key: tokens.PrivateKey | None = None) -> DaemonClient:
        return DaemonClient(
            {"uds": str(self.uds)}, self.sandbox_id, session_key or self.session_key
        )

    def bootstrap_token(self, **overrides: object) -> str:
        return tokens.mint_bootstrap_token(
            self.bootstrap_key,
            self.sandbox_id,
            tokens.public_pem(self.session_key),
            **overrides,  # type: ignore[arg-type]
        )

    def initialize(self, env: dict[str, str] | None = None) -> None:
        token = self.bootstrap_token(extra={"env": env} if env else None)
        with self.client() as c:
            response = c.init(token)
        assert response.status_code == 200, response.text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def launch_daemon(root: Path, *extra_args: str, sandbox_id: str | None = None) -> RunningDaemon:
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    uds = root / "daemon.sock"
    bootstrap = tokens.generate_p256()
    sandbox_id = sandbox_id or f"sbx-{secrets.token_hex(4)}"
    env = {
        "PATH": os.environ["PATH"],
        "SANDCELL_SANDBOX_ID": sandbox_id,
        "SANDCELL_BOOTSTRAP_PUBLIC_KEY": tokens.public_pem(bootstrap).decode(),
        "SANDCELL_WORKSPACE": str(workspace),
        **HOST_SECRETS,
        **ALLOWED_FROM_HOST,
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandcell.daemon",
            "--uds",
            str(uds),
            "--disk-quota-mb",
            "8",
            *extra_args,
        ],
        env=env,
    )
    daemon = RunningDaemon(proc, uds, workspace, sandbox_id, bootstrap)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}")
        if uds.exists():
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(uds))) as c:
                    if c.get("http://d/health").status_code == 200:
                        return daemon
            except httpx.TransportError:
                pass
        time.sleep(0.02)
    daemon.stop()
    raise RuntimeError("daemon did not become healthy")
