"""`sandcell exec -it` driven through a real pseudo-terminal, as a user at a terminal runs it;
and the process commands beside it (`ps`, `logs`, `kill`, `stats`)."""

from __future__ import annotations

import os
import select
import subprocess
import termios
import time
from collections.abc import Iterator

import pytest

from sandcell.client import ClientConfig, Sandbox
from sandcell.daemon.processes import terminal
from support.server import sandcell_bin

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox_id(env: dict[str, str]) -> Iterator[str]:
    config = ClientConfig(url=env["SANDCELL_URL"], api_key=env["SANDCELL_API_KEY"])
    with Sandbox.create(config=config) as sbx:
        yield sbx.id


class Terminal:
    """A local pty whose slave is the controlling terminal of a `sandcell` process."""

    def __init__(self, env: dict[str, str], *args: str, cols: int = 100, rows: int = 30):
        self.pty = terminal.open_pty(cols, rows)
        self.saved = termios.tcgetattr(self.pty.slave)
        argv = terminal.with_controlling_tty([sandcell_bin(), *args], self.pty.slave_path)
        self.proc = subprocess.Popen(
            argv,
            stdin=self.pty.slave,
            stdout=self.pty.slave,
            stderr=self.pty.slave,
            env=env,
            start_new_session=True,
        )
        self.seen = b""

    def send(self, data: bytes) -> None:
        os.write(self.pty.master, data)

    def expect(self, needle: bytes, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} not in {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.pty.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.pty.master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    time.sleep(0.05)

    def wait(self, timeout_s: float = 20) -> int:
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.pty.master)
        self.pty.close_slave()


def test_interactive_shell_like_docker_exec_it(env: dict[str, str], sandbox_id: str):
    term = Terminal(env, "exec", "-it", sandbox_id)
    try:
        term.send(b"stty size; tty; echo $((6*7))\r")
        term.expect(b"30 100")
        term.expect(b"/dev/pts/")
        term.expect(b"42")
        terminal.resize(term.pty.master, 120, 40)  # SIGWINCH to the local CLI
        time.sleep(0.3)
        term.send(b"stty size\r")
        term.expect(b"40 120")
        term.send(b"sleep 30\r")
        time.sleep(0.5)
        term.send(b"\x03")  # Ctrl-C: reaches the remote foreground job, not the local CLI
        term.send(b"echo after-$?\r")
        term.expect(b"after-130")
        term.send(b"exit 7\r")
        assert term.wait() == 7
        assert termios.tcgetattr(term.pty.slave) == term.saved  # the terminal is restored
    finally:
        term.close()


def test_command_exit_status_comes_back(env: dict[str, str], sandbox_id: str):
    term = Terminal(env, "exec", "-it", sandbox_id, "--", "sh", "-c", "echo in-$PPID; exit 3")
    try:
        term.expect(b"in-")
        assert term.wait() == 3
        assert termios.tcgetattr(term.pty.slave) == term.saved
    finally:
        term.close()


def test_errors_leave_the_terminal_as_it_was(env: dict[str, str]):
    term = Terminal(env, "exec", "-it", "sbx-does-not-exist")
    try:
        term.expect(b"SANDBOX_NOT_FOUND")
        assert term.wait() == 125
        assert termios.tcgetattr(term.pty.slave) == term.saved
    finally:
        term.close()


def test_interactive_without_terminal_pipes_stdin(env: dict[str, str], sandbox_id: str):
    done = subprocess.run(
        [sandcell_bin(), "exec", "-i", sandbox_id, "--", "sh", "-c", "tr a-z A-Z; exit 4"],
        input=b"hello pipes\n",
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert done.stdout == b"HELLO PIPES\n"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sandcell_bin(), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_ps_logs_kill_stats(env: dict[str, str], sandbox_id: str):
    config = ClientConfig(url=env["SANDCELL_URL"], api_key=env["SANDCELL_API_KEY"])
    with Sandbox.connect(sandbox_id, config=config) as sbx:
        script = (
            "trap 'echo bye; exit 3' TERM; echo hello; echo oops >&2; while :; do sleep 0.05; done"
        )
        handle = sbx.commands.run(script, background=True, tag="svc")
        listing = cli(env, "ps", sandbox_id)
        assert listing.returncode == 0, listing.stderr
        assert str(handle.pid) in listing.stdout and "svc" in listing.stdout
        assert "running" in listing.stdout

        deadline = time.monotonic() + 10
        while "hello" not in (logged := cli(env, "logs", sandbox_id, str(handle.pid))).stdout:
            assert time.monotonic() < deadline, logged
        assert "oops" in logged.stderr

        follower = subprocess.Popen(
            [sandcell_bin(), "logs", "-f", sandbox_id, str(handle.pid)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        killed = cli(env, "kill", sandbox_id, str(handle.pid), "--signal", "TERM")
        assert killed.returncode == 0, killed.stderr
        out, _ = follower.communicate(timeout=30)
        assert "hello" in out and "bye" in out and follower.returncode == 0
        assert handle.wait().exit_code == 3

        sleeper = sbx.commands.run("sleep 600", background=True)
        assert cli(env, "kill", sandbox_id, str(sleeper.pid)).returncode == 0
        assert sleeper.wait().signal == 9
        missing = cli(env, "kill", sandbox_id, "999999")
        assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr

        stats = cli(env, "stats", sandbox_id)
        assert stats.returncode == 0, stats.stderr
        assert "memory" in stats.stdout and "MiB" in stats.stdout
