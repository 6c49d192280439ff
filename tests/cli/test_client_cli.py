"""The client commands (`sandcell create|ls|exec|run|cp|rm`) as a user runs them: a real
`sandcell` process against a real server, configured through SANDCELL_URL/SANDCELL_API_KEY."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.client import ClientConfig, Sandbox
from support.server import RunningServer, free_port, sandcell_bin


@pytest.fixture(scope="module")
def run_env(server: RunningServer, env: dict[str, str]) -> dict[str, str]:
    """A key of its own for `run`, so "nothing left behind" means exactly that."""
    return {**env, "SANDCELL_API_KEY": server.create_key("cli-run")}


def sandcell(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sandcell_bin(), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def left_behind(env: dict[str, str]) -> list[str]:
    cfg = ClientConfig(url=env["SANDCELL_URL"], api_key=env["SANDCELL_API_KEY"])
    return [s.id for s in Sandbox.list(config=cfg)]


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sandcell: {code}: "), done.stderr


def test_create_ls_rm(env: dict[str, str]):
    created = sandcell(env, "create", "--timeout", "120")
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.strip()
    assert sandbox_id.startswith("sbx-") and "\n" not in sandbox_id

    as_json = sandcell(env, "create", "--json", "--metadata", "job=42")
    info = json.loads(as_json.stdout)
    assert info["state"] == "running" and info["metadata"] == {"job": "42"}

    listed = sandcell(env, "ls")
    assert listed.returncode == 0 and sandbox_id in listed.stdout and info["id"] in listed.stdout
    rows = json.loads(sandcell(env, "ls", "--json").stdout)
    by_id = {row["id"]: row for row in rows}
    assert by_id[sandbox_id]["idle_timeout_s"] == 120

    removed = sandcell(env, "rm", sandbox_id, info["id"])
    assert removed.returncode == 0, removed.stderr
    assert left_behind(env) == []
    assert_one_line_error(sandcell(env, "rm", sandbox_id), "SANDBOX_NOT_FOUND")


@pytest.fixture(scope="module")
def sandbox_id(env: dict[str, str]) -> Iterator[str]:
    done = sandcell(env, "create")
    assert done.returncode == 0, done.stderr
    yield done.stdout.strip()
    sandcell(env, "rm", done.stdout.strip())


def test_exec_streams_and_passes_the_exit_code_through(env: dict[str, str], sandbox_id: str):
    done = sandcell(env, "exec", sandbox_id, "--", "echo out; echo err >&2; exit 7")
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")

    # Several words: argv, no shell ($HOME stays literal, 'a b' stays one argument).
    argv = sandcell(
        env, "exec", sandbox_id, "--", "python3", "-c", "import sys; print(sys.argv[1:])", "a b"
    )
    assert argv.returncode == 0 and argv.stdout == "['a b']\n"

    env_cwd = sandcell(
        env, "exec", sandbox_id, "-e", "X=1", "--", "mkdir -p d && cd d && echo $X $(pwd)"
    )
    assert env_cwd.stdout == "1 /workspace/d\n"

    timed_out = sandcell(env, "exec", sandbox_id, "--timeout", "0.5", "--", "sleep 5")
    assert timed_out.returncode == 124

    as_json = sandcell(env, "exec", sandbox_id, "--json", "--", "echo hi; exit 3")
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["stdout"] == "hi\n"


def test_exec_streams_output_live(env: dict[str, str], sandbox_id: str):
    proc = subprocess.Popen(
        [sandcell_bin(), "exec", sandbox_id, "--", "echo first; sleep 2; echo second"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    started = time.monotonic()
    assert proc.stdout.readline() == "first\n"
    assert time.monotonic() - started < 1.9  # before the command ended
    assert proc.stdout.read() == "second\n"
    assert proc.wait(10) == 0


def test_cp_both_ways(env: dict[str, str], sandbox_id: str, tmp_path: Path):
    local = tmp_path / "data.bin"
    payload = os.urandom(3 * 1_048_576 + 7)
    local.write_bytes(payload)

    up = sandcell(env, "cp", str(local), f"{sandbox_id}:inbox/")
    assert up.returncode == 0, up.stderr
    check = sandcell(env, "exec", sandbox_id, "--", "stat -c %s inbox/data.bin")
    assert check.stdout.strip() == str(len(payload))

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    down = sandcell(env, "cp", "--json", f"{sandbox_id}:inbox/data.bin", str(out_dir))
    assert down.returncode == 0, down.stderr
    summary = json.loads(down.stdout)
    assert summary["size"] == len(payload) and summary["direction"] == "download"
    assert (out_dir / "data.bin").read_bytes() == payload

    renamed = sandcell(env, "cp", f"{sandbox_id}:inbox/data.bin", str(tmp_path / "copy.bin"))
    assert renamed.returncode == 0 and (tmp_path / "copy.bin").read_bytes() == payload

    assert_one_line_error(
        sandcell(env, "cp", f"{sandbox_id}:missing.txt", str(tmp_path)), "FILE_NOT_FOUND"
    )
    neither = sandcell(env, "cp", str(local), str(tmp_path / "x"))
    assert neither.returncode == 2 and "exactly one of SRC and DST" in neither.stderr


def test_errors_are_one_line_never_a_traceback(env: dict[str, str]):
    done = sandcell({**env, "SANDCELL_API_KEY": "sc_wrong"}, "ls")
    assert_one_line_error(done, "UNAUTHENTICATED")
    assert done.returncode == 1
    done = sandcell({**env, "SANDCELL_URL": f"http://127.0.0.1:{free_port()}"}, "ls")
    assert_one_line_error(done, "CONNECTION_FAILED")
    done = sandcell(env, "exec", "sbx-0000000000000000", "--", "true")
    assert_one_line_error(done, "SANDBOX_NOT_FOUND")
    assert done.returncode == 125  # exec/run: sandcell's own failure, not the command's
    # --url/--api-key override the environment.
    done = sandcell(env, "ls", "--json", "--api-key", "sc_wrong")
    assert_one_line_error(done, "UNAUTHENTICATED")


def test_run_success_and_failure_leave_nothing_behind(run_env: dict[str, str]):
    ok = sandcell(run_env, "run", "--", "echo hello from a throw-away sandbox")
    assert (ok.returncode, ok.stdout) == (0, "hello from a throw-away sandbox\n")
    assert left_behind(run_env) == []

    failed = sandcell(run_env, "run", "--", "python3", "-c", "import sys; sys.exit(3)")
    assert failed.returncode == 3
    assert left_behind(run_env) == []

    broken = sandcell(run_env, "run", "--cwd", "no/such/dir", "--", "true")  # sandcell fails
    assert_one_line_error(broken, "FILE_NOT_FOUND")
    assert broken.returncode == 125
    assert left_behind(run_env) == []


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_run_interrupted_leaves_nothing_behind(run_env: dict[str, str], sig: int, code: int):
    proc = subprocess.Popen(
        [sandcell_bin(), "run", "--", "sleep 30"],
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not left_behind(run_env):  # the sandbox exists...
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # ...and the command has started
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert left_behind(run_env) == []
