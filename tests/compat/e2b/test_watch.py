"""Directory watches through the e2b SDK: the sync poller and the async stream."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox, FilesystemEventType, Sandbox

pytestmark = pytest.mark.slow


def test_sync_watch(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched/sub")
    sbx.files.write("/home/user/watched/old.txt", "1")
    handle = sbx.files.watch_dir("/home/user/watched", recursive=True)
    # Changes made inside the sandbox are seen by polling, as net effects between two polls:
    # new.txt comes and goes unseen; "sub" may also show a WRITE when its mtime moved by
    # more than the clock's granularity.
    sbx.commands.run(
        "cd watched && echo x > new.txt && echo 22 > old.txt && echo y > sub/deep.txt"
        " && rm new.txt old.txt"
    )
    seen = {(e.name, e.type) for e in handle.get_new_events()}
    assert seen - {("sub", FilesystemEventType.WRITE)} == {
        ("sub/deep.txt", FilesystemEventType.CREATE),
        ("old.txt", FilesystemEventType.REMOVE),
    }
    # A write through the files API is reported as envd's upload makes it, once.
    sbx.files.write("/home/user/watched/later.txt", "z")
    assert [(e.name, e.type) for e in handle.get_new_events()] == [
        ("later.txt", FilesystemEventType.CREATE),
        ("later.txt", FilesystemEventType.CHMOD),
        ("later.txt", FilesystemEventType.WRITE),
    ]
    sbx.files.remove("/home/user/watched/later.txt")
    assert [(e.name, e.type) for e in handle.get_new_events()] == [
        ("later.txt", FilesystemEventType.REMOVE)
    ]
    handle.stop()


def test_async_watch() -> None:
    async def scenario() -> list[tuple[str, FilesystemEventType]]:
        sandbox = await AsyncSandbox.create()
        seen: list[tuple[str, FilesystemEventType]] = []
        try:
            await sandbox.files.make_dir("/home/user/w")
            handle = await sandbox.files.watch_dir(
                "/home/user/w", on_event=lambda e: seen.append((e.name, e.type))
            )
            await sandbox.files.write("/home/user/w/a.txt", "a")
            deadline = time.monotonic() + 10
            while len(seen) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await handle.stop()
        finally:
            await sandbox.kill()
        return seen

    assert asyncio.run(scenario()) == [
        ("a.txt", FilesystemEventType.CREATE),
        ("a.txt", FilesystemEventType.CHMOD),
        ("a.txt", FilesystemEventType.WRITE),
    ]
