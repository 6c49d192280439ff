"""Background processes, terminals and metrics through the SDK, once sync and once async."""

from __future__ import annotations

import time

import anyio
import pytest

from sandcell.client import (
    ClientConfig,
    CommandResult,
    ConflictError,
    ProcessInfo,
    SandboxMetrics,
)
from sdk.helpers import Flavour

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BIG = 3_000_000  # past the 1 MiB that a buffered result keeps


async def test_background_with_open_stdin(flavour: Flavour, config: ClientConfig, shared_sandbox):
    async with flavour.connected(shared_sandbox, config) as sbx:
        handle = await flavour(sbx.commands.run("cat", background=True, stdin=True))
        assert handle.pid > 0
        await flavour(handle.send_stdin("one\n"))
        await flavour(handle.send_stdin(b"two\n"))
        await flavour(handle.close_stdin())
        result = await flavour(handle.wait())
        assert isinstance(result, CommandResult)
        assert (result.exit_code, result.stdout) == (0, "one\ntwo\n")
        with pytest.raises(ConflictError):
            await flavour(handle.send_stdin("late"))


async def test_callbacks_get_every_byte(flavour: Flavour, config: ClientConfig, shared_sandbox):
    command = f"head -c {BIG} /dev/zero | tr '\\0' a; echo done >&2"
    async with flavour.connected(shared_sandbox, config) as sbx:
        out: list[str] = []
        err: list[str] = []
        handle = await flavour(
            sbx.commands.run(command, background=True, on_stdout=out.append, on_stderr=err.append)
        )
        result = await flavour(handle.wait())
        assert len("".join(out)) == BIG and "".join(err) == "done\n"
        assert result.stdout_truncated and len(result.stdout) == 1_048_576

        streamed: list[str] = []
        result = await flavour(sbx.commands.run(command, on_stdout=streamed.append))
        assert len("".join(streamed)) == BIG and result.exit_code == 0
        assert result.stdout_truncated and len(result.stdout) == 1_048_576  # memory bounded


async def test_signal_list_connect_kill(flavour: Flavour, config: ClientConfig, shared_sandbox):
    script = "trap 'echo usr1; exit 5' USR1; echo ready; while :; do sleep 0.05; done"
    async with flavour.connected(shared_sandbox, config) as sbx:
        handle = await flavour(sbx.commands.run(script, background=True, tag="trap"))
        listed = await flavour(sbx.commands.list())
        assert all(isinstance(p, ProcessInfo) for p in listed)
        assert [p.tag for p in listed if p.pid == handle.pid] == ["trap"]
        seen: list[str] = []
        again = await flavour(sbx.commands.connect(handle.pid, on_stdout=seen.append))
        deadline = time.monotonic() + 10
        while "ready" not in "".join(seen):
            assert time.monotonic() < deadline
            await anyio.sleep(0.05)  # the follower is a thread (sync) or a task (async)
        await flavour(handle.signal("SIGUSR1"))
        result = await flavour(again.wait())
        assert result.exit_code == 5 and "usr1" in "".join(seen)

        sleeper = await flavour(sbx.commands.run("sleep 600", background=True))
        assert await flavour(sbx.commands.kill(sleeper.pid)) is True
        assert (await flavour(sleeper.wait())).signal == 9
        assert await flavour(sbx.commands.kill(999_999)) is False


async def test_pty_resize_and_exit(flavour: Flavour, config: ClientConfig, shared_sandbox):
    async with flavour.connected(shared_sandbox, config) as sbx:
        data: list[bytes] = []
        term = await flavour(sbx.pty.create(cols=80, rows=24, on_data=data.append))
        await flavour(term.send_input("stty size\n"))
        deadline = time.monotonic() + 10
        while b"24 80" not in b"".join(data):
            assert time.monotonic() < deadline
            await anyio.sleep(0.05)
        await flavour(term.resize(100, 40))
        await flavour(term.send_input("tty; stty size; exit 4\n"))
        result = await flavour(term.wait())
        screen = b"".join(data)
        assert result.exit_code == 4
        assert b"40 100" in screen and b"/dev/pts/" in screen


async def test_metrics(flavour: Flavour, config: ClientConfig, shared_sandbox):
    async with flavour.connected(shared_sandbox, config) as sbx:
        m = await flavour(sbx.get_metrics())
        assert isinstance(m, SandboxMetrics)
        assert m.memory_bytes is not None and 0 < m.memory_bytes <= m.memory_limit_bytes
        assert m.pids is not None and m.pids >= 1 and m.pids_limit > 0
        assert m.disk_limit_bytes > 0 and m.cpus > 0
