"""Every SDK method against a real server, each test once with `Sandbox` and `AsyncSandbox`."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from sandcell.client import (
    AsyncSandbox,
    ClientConfig,
    CommandExitError,
    CommandResult,
    ConflictError,
    EntryInfo,
    FileNotFoundInSandboxError,
    Sandbox,
    SandboxInfo,
    SandboxNotFoundError,
)
from sdk.helpers import Flavour

pytestmark = pytest.mark.anyio


async def test_lifecycle_create_info_keepalive_list_connect_kill(
    flavour: Flavour, config: ClientConfig
):
    sbx = await flavour(
        flavour.cls.create(timeout=120, lifetime=600, metadata={"owner": "tests"}, config=config)
    )
    try:
        assert isinstance(sbx, flavour.cls)
        info = await flavour(sbx.info())
        assert isinstance(info, SandboxInfo)
        assert (info.id, info.template, info.state) == (sbx.id, "default", "running")
        assert info.idle_timeout_s == 120 and info.metadata == {"owner": "tests"}
        assert 590 <= (info.expires_at - info.created_at).total_seconds() <= 610
        assert abs((datetime.now(UTC) - info.created_at).total_seconds()) < 60

        kept = await flavour(sbx.keepalive(idle_timeout_s=90))
        assert kept.idle_timeout_s == 90 and kept.last_activity_at >= info.last_activity_at
        assert (await flavour(sbx.keepalive())).idle_timeout_s == 90

        assert sbx.id in [s.id for s in await flavour(flavour.cls.list(config=config))]
        other = await flavour(flavour.cls.connect(sbx.id, config=config))
        assert other.id == sbx.id and other.last_info.metadata == {"owner": "tests"}
        await flavour(other.close())
    finally:
        assert await flavour(sbx.kill()) is True
    assert await flavour(sbx.kill()) is False  # nothing left to do, and it says so
    with pytest.raises(SandboxNotFoundError):
        await flavour(sbx.info())
    with pytest.raises(SandboxNotFoundError):
        await flavour(flavour.cls.connect(sbx.id, config=config))
    assert sbx.id not in [s.id for s in await flavour(flavour.cls.list(config=config))]
    await flavour(sbx.close())


async def test_the_context_manager_kills_the_sandbox_even_on_error(config: ClientConfig):
    with pytest.raises(RuntimeError), Sandbox.create(config=config) as sbx:
        raise RuntimeError("boom")
    async with AsyncSandbox.create(config=config) as asbx:
        assert (await asbx.commands.run("echo hi")).stdout == "hi\n"
    alive = {s.id for s in Sandbox.list(config=config)}
    assert sbx.id not in alive and asbx.id not in alive


async def test_environment_from_the_environment_variables(
    flavour: Flavour, config: ClientConfig, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SANDCELL_URL", config.url)
    monkeypatch.setenv("SANDCELL_API_KEY", config.api_key or "")
    # Default env at creation, request env on top: the request wins, empty values are kept.
    async with flavour.sandbox(ClientConfig.resolve(), env={"A": "1", "B": "2"}) as sbx:
        r = await flavour(sbx.commands.run('echo "$A$B[$C]"', env={"B": "3", "C": ""}))
        assert r.stdout == "13[]\n"


async def test_commands_run(flavour: Flavour, config: ClientConfig, shared_sandbox: str):
    async with flavour.connected(shared_sandbox, config) as sbx:
        run = sbx.commands.run
        r = await flavour(run("echo out; echo err >&2; exit 3"))
        assert isinstance(r, CommandResult)
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
        assert r.duration_s > 0 and not r.ok

        r = await flavour(run(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME"]))
        assert r.stdout == "['a b', '$HOME']\n"  # argv: no shell

        await flavour(sbx.files.mkdir("work/sub"))
        r = await flavour(run("pwd; cat", cwd="work/sub", stdin="fed via stdin"))
        assert r.stdout == "/workspace/work/sub\nfed via stdin"

        r = await flavour(run("head -c 5000 /dev/zero | tr '\\0' x", max_output_bytes=100))
        assert r.stdout == "x" * 100 and r.stdout_truncated and not r.stderr_truncated

        r = await flavour(run("sleep 10", timeout=0.5))
        assert r.timed_out and r.exit_code == 124 and r.duration_s < 5

        assert (await flavour(run("true", check=True))).exit_code == 0
        with pytest.raises(CommandExitError) as failed:
            await flavour(run("echo why >&2; exit 2", check=True))
        assert failed.value.result.exit_code == 2 and failed.value.result.stderr == "why\n"
        assert "exited with 2" in str(failed.value) and "why" in str(failed.value)


async def test_streaming_callbacks_get_output_as_it_arrives(
    flavour: Flavour, config: ClientConfig, shared_sandbox: str
):
    seen: list[tuple[str, float, str]] = []
    started = time.monotonic()

    def on_stdout(text: str) -> None:
        seen.append(("out", time.monotonic() - started, text))

    async def on_stderr_async(text: str) -> None:  # the async client awaits coroutines
        seen.append(("err", time.monotonic() - started, text))

    def on_stderr(text: str) -> None:
        seen.append(("err", time.monotonic() - started, text))

    async with flavour.connected(shared_sandbox, config) as sbx:
        r = await flavour(
            sbx.commands.run(
                "echo a; echo e >&2; sleep 1; echo b",
                on_stdout=on_stdout,
                on_stderr=on_stderr_async if flavour.name == "async" else on_stderr,
            )
        )
    ended = time.monotonic() - started
    assert (r.exit_code, r.stdout, r.stderr) == (0, "a\nb\n", "e\n")
    assert "".join(t for k, _, t in seen if k == "out") == "a\nb\n"
    assert "".join(t for k, _, t in seen if k == "err") == "e\n"
    first = seen[0]
    assert first[2] == "a\n" or first[2] == "e\n"
    assert first[1] < ended - 0.7, f"first chunk at {first[1]:.2f}s, command ended {ended:.2f}s"


async def test_files(flavour: Flavour, config: ClientConfig, shared_sandbox: str):
    async with flavour.connected(shared_sandbox, config) as sbx:
        files = sbx.files
        root = f"files-{flavour.name}"
        entry = await flavour(files.write(f"{root}/a/b.txt", b"hello\x00bytes"))
        assert isinstance(entry, EntryInfo)
        assert (entry.path, entry.name, entry.type, entry.size) == (
            f"{root}/a/b.txt",
            "b.txt",
            "file",
            11,
        )
        assert await flavour(files.read(f"{root}/a/b.txt")) == b"hello\x00bytes"
        await flavour(files.write(f"{root}/t.txt", "héllo"))
        assert await flavour(files.read_text(f"{root}/t.txt")) == "héllo"
        await flavour(files.write(f"{root}/empty", b""))
        assert await flavour(files.read(f"{root}/empty")) == b""

        listed = await flavour(files.list(root))
        assert [(e.name, e.type) for e in listed] == [
            ("a", "dir"),
            ("empty", "file"),
            ("t.txt", "file"),
        ]
        deep = await flavour(files.list(root, depth=2))
        assert f"{root}/a/b.txt" in [e.path for e in deep]

        st = await flavour(files.stat(f"{root}/a"))
        assert st.is_dir and st.mode == "0755"
        assert await flavour(files.exists(f"{root}/t.txt"))
        assert not await flavour(files.exists(f"{root}/missing"))

        made = await flavour(files.mkdir(f"{root}/x/y/z"))
        assert made.is_dir and made.path == f"{root}/x/y/z"
        await flavour(files.mkdir(f"{root}/x/y/z"))  # parents=True: existing is fine
        with pytest.raises(FileNotFoundInSandboxError):
            await flavour(files.mkdir(f"{root}/nope/child", parents=False))

        moved = await flavour(files.move(f"{root}/t.txt", f"{root}/x/t2.txt"))
        assert moved.path == f"{root}/x/t2.txt"
        assert not await flavour(files.exists(f"{root}/t.txt"))
        with pytest.raises(ConflictError):
            await flavour(files.move(f"{root}/empty", f"{root}/x/t2.txt"))
        await flavour(files.move(f"{root}/empty", f"{root}/x/t2.txt", overwrite=True))
        assert await flavour(files.read(f"{root}/x/t2.txt")) == b""

        await flavour(files.remove(f"{root}/a/b.txt"))
        await flavour(files.remove(f"{root}/a"))  # now empty
        with pytest.raises(ConflictError):  # not empty, not recursive
            await flavour(files.remove(f"{root}/x"))
        await flavour(files.remove(root, recursive=True))
        assert not await flavour(files.exists(root))
        with pytest.raises(FileNotFoundInSandboxError):
            await flavour(files.read(f"{root}/x/t2.txt"))
