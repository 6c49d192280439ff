"""The edges of envd's process service through the unmodified e2b SDK: what one run costs the
daemon, a pid that is not there, a stream's deadline (Connect-Timeout-Ms), a sandbox that
goes mid-run, and a short sandbox timeout."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import NotFoundException, SandboxNotRunningException, TimeoutException

from support.server import RunningServer

GONE = "sandbox was killed or reached its end of life"  # E2B's own test asserts these words
_CALLS = re.compile(r"^sandcell_daemon_calls_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _daemon_calls(server: RunningServer) -> float:
    """The router's count of signed calls to daemons (its /metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(v) for v in _CALLS.findall(text))


def _within(seconds: float, done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.1)
    return done()


def _running(sbx: Sandbox, command: str) -> bool:
    return any(" ".join(p.args).endswith(command) for p in sbx.commands.list())


def test_a_foreground_run_is_one_daemon_call(sbx: Sandbox, e2b_server: RunningServer) -> None:
    """Start is served by one daemon call (the process started and followed at once), not
    a start and then a follow: the façade's share of SPEC §16's E2B figure."""
    sbx.commands.run("true")
    before = _daemon_calls(e2b_server)
    for _ in range(3):
        assert sbx.commands.run("echo hi").stdout == "hi\n"
    assert _daemon_calls(e2b_server) - before == 3


def test_connect_to_a_missing_pid_raises(sbx: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999_999)

    async def connect_async() -> None:
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        await again.commands.connect(999_998)  # envd ends the stream before any event

    with pytest.raises(NotFoundException):
        asyncio.run(connect_async())


def test_an_async_run_past_its_timeout_raises_and_the_command_dies(sbx: Sandbox) -> None:
    """The async SDK leaves the deadline to the server (its client timer is bound to the
    task that read the first event): Connect-Timeout-Ms ends the stream with
    deadline_exceeded and kills the command, as envd does."""

    async def run() -> float:
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            await again.commands.run("sleep 30; echo late", timeout=2)
        return time.monotonic() - started

    assert 1.5 < asyncio.run(run()) < 10
    assert _within(10, lambda: not _running(sbx, "sleep 30; echo late"))


def test_a_connect_past_its_timeout_raises_and_the_command_lives(sbx: Sandbox) -> None:
    """A Connect stream's deadline ends the stream only: the command runs on (envd's)."""
    handle = sbx.commands.run("sleep 30", background=True)

    async def follow() -> None:
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        followed = await again.commands.connect(handle.pid, timeout=1)
        await followed.wait()

    try:
        with pytest.raises(TimeoutException):
            asyncio.run(follow())
        assert _running(sbx, "sleep 30")
    finally:
        handle.kill()


def test_a_sandbox_killed_mid_run_raises_not_running() -> None:
    doomed = Sandbox.create()
    try:
        threading.Thread(
            target=lambda: _within(20, lambda: _running(doomed, "sleep 60")) and doomed.kill(),
            daemon=True,
        ).start()
        started = time.monotonic()
        with pytest.raises(SandboxNotRunningException, match=GONE):
            doomed.commands.run("sleep 60")
        assert time.monotonic() - started < 20
    finally:
        doomed.kill()


def test_an_async_run_in_a_sandbox_killed_mid_run_raises_not_running() -> None:
    async def run() -> None:
        doomed = await AsyncSandbox.create()
        try:
            handle = await doomed.commands.run("sleep 60", background=True)
            await doomed.kill()
            with pytest.raises(SandboxNotRunningException, match=GONE):
                await asyncio.wait_for(handle.wait(), 20)
        finally:
            await doomed.kill()

    asyncio.run(run())


@pytest.mark.slow
def test_set_timeout_5_ends_the_sandbox_within_a_reaper_pass() -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        started = time.monotonic()
        sbx.set_timeout(5)
        # Gone at the end, or at the reaper's next pass after it (every 5 s), with slack.
        assert _within(15, lambda: not sbx.is_running())
        assert 4 <= time.monotonic() - started <= 15
        with pytest.raises(SandboxNotRunningException):
            sbx.commands.run("true")
    finally:
        sbx.kill()


def test_killing_an_exited_command_answers_false(sbx: Sandbox) -> None:
    handle = sbx.commands.run("true", background=True)
    handle.wait()
    assert sbx.commands.kill(handle.pid) is False


def test_a_run_past_its_timeout_kills_the_command(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30; echo sync", timeout=1)
    assert _within(10, lambda: not _running(sbx, "sleep 30; echo sync"))


@pytest.mark.parametrize("value", ["soon", "-5", "12345678901", "1.5"])
def test_a_bad_connect_timeout_is_refused(
    e2b_server: RunningServer, sbx: Sandbox, value: str
) -> None:
    message = b'{"process": {"cmd": "true"}}'
    answer = httpx.post(
        f"{e2b_server.url}/e2b/process.Process/Start",
        content=len(message).to_bytes(5, "big") + message,
        headers={
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "X-Access-Token": sbx._envd_access_token or "",
            "content-type": "application/connect+json",
            "connect-timeout-ms": value,
        },
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_argument"
    assert "Connect-Timeout-Ms" in answer.json()["message"]


def test_a_sandbox_killed_mid_stream_drops_the_connection(e2b_server: RunningServer) -> None:
    """As E2B's does: the SDKs take a dropped connection as the cue to probe the sandbox
    (the JS SDK only then names it killed); an `unavailable` end of stream would read as a
    stream that ended well but for an error."""
    doomed = Sandbox.create()
    message = b'{"process": {"cmd": "sleep", "args": ["60"]}}'
    headers = {
        "E2b-Sandbox-Id": doomed.sandbox_id,
        "X-Access-Token": doomed._envd_access_token or "",
        "content-type": "application/connect+json",
    }
    body = len(message).to_bytes(5, "big") + message
    try:
        with httpx.Client(timeout=30) as client:
            url = f"{e2b_server.url}/e2b/process.Process/Start"
            with client.stream("POST", url, content=body, headers=headers) as answer:
                chunks = answer.iter_raw()
                assert b'"start"' in next(chunks)
                doomed.kill()
                with pytest.raises(httpx.ReadError, match="reset"):  # a reset, not a FIN
                    for _ in chunks:
                        pass
    finally:
        doomed.kill()
