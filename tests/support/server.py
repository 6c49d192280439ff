"""Launching a real `sandcell serve` on loopback, with its own data dir and config."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

SMALL_TEMPLATE = """
[templates.default]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = {warm_pool}
idle_timeout_s = 300
"""
# A small default template that a create may open to any egress (sandcell's own default
# opens none), with no warm pool.
OPEN_TEMPLATE = """
[templates.default]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 0
network_max = "open"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sandcell_bin() -> str:
    return str(Path(sys.executable).with_name("sandcell"))


@dataclass
class RunningServer:
    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    config: Path
    log: Path
    verify: ssl.SSLContext | bool = True  # trusting a TLS listener's CA

    def create_key(self, name: str, admin: bool = False, e2b: bool = False) -> str:
        args = [
            sandcell_bin(),
            "keys",
            "create",
            name,
            "--data-dir",
            str(self.data_dir),
            "--config",
            str(self.config),
            *(["--admin"] if admin else []),
            *(["--e2b"] if e2b else []),
        ]
        return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()

    def revoke_key(self, name: str) -> None:
        subprocess.run(
            [
                sandcell_bin(),
                "keys",
                "revoke",
                name,
                "--data-dir",
                str(self.data_dir),
                "--config",
                str(self.config),
            ],
            check=True,
        )

    def client(self, key: str | None = None, timeout: float = 60) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=self.verify)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(
    data_dir: Path,
    *,
    config_text: str | None = None,
    warm_pool: int = 0,
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
    tls_ca: Path | None = None,
) -> RunningServer:
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir.parent / f"{data_dir.name}.toml"
    config.write_text(config_text or SMALL_TEMPLATE.format(warm_pool=warm_pool))
    port = port or free_port()
    log = data_dir.parent / f"{data_dir.name}-{port}.log"
    env = {**os.environ, **(extra_env or {})}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sandcell_bin(),
                "serve",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
                "--config",
                str(config),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    verify: ssl.SSLContext | bool = True
    scheme = "http"
    if tls_ca is not None:
        scheme, verify = "https", ssl.create_default_context(cafile=tls_ca)
    server = RunningServer(proc, f"{scheme}://127.0.0.1:{port}", data_dir, config, log, verify)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sandcell serve exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=1, verify=verify).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"sandcell serve did not become ready: {log.read_text()[-3000:]}")
