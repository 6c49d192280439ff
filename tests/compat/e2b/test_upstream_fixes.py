"""What E2B's own SDK tests expect and the façade did not do, driven through the unmodified
e2b SDK (tests/compat/e2b/upstream/run.py runs those tests themselves): the sandbox user's
name on file info, symlinks followed as envd follows them, lists newest first, a started-after
bound that finds the sandbox's own start, and watchers that see the files API's writes as
envd's upload makes them."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from e2b import AsyncSandbox, FilesystemEvent, FilesystemEventType, FileType, Sandbox, SandboxQuery

WAIT_S = 10


def test_file_info_names_the_sandbox_user_as_e2b_does(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/owner/a.txt", "abc")
    info = sbx.files.get_info("/home/user/owner/a.txt")
    assert (info.owner, info.group) == ("user", "user")
    listed = sbx.files.list("/home/user/owner")
    assert [(e.name, e.owner, e.group) for e in listed] == [("a.txt", "user", "user")]


def test_a_symlink_is_followed_for_its_type_and_target(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/links/target.txt", "x")
    sbx.commands.run(
        "mkdir -p links/sub && ln -s target.txt links/one && ln -s ../one links/sub/two"
    )
    info = sbx.files.get_info("/home/user/links/one")
    assert (info.type, info.symlink_target) == (FileType.FILE, "/home/user/links/target.txt")
    chained = sbx.files.get_info("/home/user/links/sub/two")  # a link to a link
    assert (chained.type, chained.symlink_target) == (FileType.FILE, "/home/user/links/target.txt")
    sbx.commands.run(
        "ln -s missing links/dangling && ln -s /etc/hostname links/root"
        " && ln -s /proc/self/environ links/out"
    )
    dangling = sbx.files.get_info("/home/user/links/dangling")
    assert (dangling.type, dangling.symlink_target) == (
        FileType.SYMLINK,
        "/home/user/links/missing",
    )
    root = sbx.files.get_info("/home/user/links/root")  # the cell's root: read-only, reached
    assert (root.type, root.symlink_target) == (FileType.FILE, "/etc/hostname")
    out = sbx.files.get_info("/home/user/links/out")  # beyond the files API: left a symlink
    assert (out.type, out.symlink_target) == (FileType.SYMLINK, "/proc/self/environ")
    listed = {e.name: (e.type, e.symlink_target) for e in sbx.files.list("/home/user/links")}
    assert listed["one"] == (FileType.FILE, "/home/user/links/target.txt")


@pytest.mark.slow
def test_list_is_newest_first_and_started_after_is_inclusive() -> None:
    tag = uuid.uuid4().hex
    older = Sandbox.create(timeout=120, metadata={"run": tag})
    newer = Sandbox.create(timeout=120, metadata={"run": tag})
    try:
        pages = Sandbox.list(query=SandboxQuery(metadata={"run": tag}), limit=1)
        first, second = pages.next_items(), pages.next_items()
        assert [s.sandbox_id for s in first + second] == [newer.sandbox_id, older.sandbox_id]
        assert not pages.has_next
        started = newer.get_info().started_at
        since = Sandbox.list(query=SandboxQuery(metadata={"run": tag}, started_after=started))
        assert [s.sandbox_id for s in since.next_items()] == [newer.sandbox_id]
    finally:
        older.kill()
        newer.kill()


def test_a_watcher_sees_an_upload_as_envd_makes_it(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched")
    handle = sbx.files.watch_dir("/home/user/watched")
    try:
        sbx.files.write("/home/user/watched/new.txt", "first")
        events = handle.get_new_events()
        assert [(e.type, e.name) for e in events] == [
            (FilesystemEventType.CREATE, "new.txt"),
            (FilesystemEventType.CHMOD, "new.txt"),
            (FilesystemEventType.WRITE, "new.txt"),
        ]
        sbx.files.write("/home/user/watched/new.txt", "second")
        kinds = [e.type for e in handle.get_new_events()]
        assert kinds == [FilesystemEventType.WRITE, FilesystemEventType.CHMOD, kinds[-1]]
        assert kinds[-1] == FilesystemEventType.WRITE
        assert handle.get_new_events() == []  # the next poll does not report it again
        sbx.files.write("/home/user/elsewhere.txt", "x")  # outside the watch: not seen
        assert handle.get_new_events() == []
    finally:
        handle.stop()


def test_a_recursive_watch_reports_a_write_in_a_folder_not_the_folder(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/deep/nested")
    handle = sbx.files.watch_dir("/home/user/deep", recursive=True)
    try:
        sbx.files.write("/home/user/deep/nested/f.txt", "x")
        sbx.commands.run("echo y > deep/nested/g.txt")  # seen by the poll: CREATE only
        assert [(e.type, e.name) for e in handle.get_new_events()] == [
            (FilesystemEventType.CREATE, "nested/f.txt"),
            (FilesystemEventType.CHMOD, "nested/f.txt"),
            (FilesystemEventType.WRITE, "nested/f.txt"),
            (FilesystemEventType.CREATE, "nested/g.txt"),
        ]
    finally:
        handle.stop()


def test_a_recursive_watch_sees_a_write_in_a_folder_made_after_it() -> None:
    async def scenario() -> list[tuple[FilesystemEventType, str]]:
        sbx = await AsyncSandbox.create(timeout=120)
        try:
            await sbx.files.make_dir("/home/user/tree")
            seen: list[tuple[FilesystemEventType, str]] = []
            wrote = asyncio.Event()

            def on_event(event: FilesystemEvent) -> None:
                seen.append((event.type, event.name))
                if (event.type, event.name) == (FilesystemEventType.WRITE, "sub/f.txt"):
                    wrote.set()

            handle = await sbx.files.watch_dir("/home/user/tree", on_event=on_event, recursive=True)
            await sbx.files.make_dir("/home/user/tree/sub")
            await sbx.files.write("/home/user/tree/sub/f.txt", "content")
            await asyncio.wait_for(wrote.wait(), WAIT_S)
            await handle.stop()
            return seen
        finally:
            await sbx.kill()

    assert (FilesystemEventType.CREATE, "sub/f.txt") in asyncio.run(scenario())


def test_python_names_python3_as_on_e2bs_base(sbx: Sandbox) -> None:
    ran = sbx.commands.run("python -c 'import sys; print(sys.version_info[0])'; command -v python")
    assert ran.stdout.split() == ["3", "/usr/local/bin/python"]
    # Its arguments reach python3 as given, and python3 is its own.
    args = sbx.commands.run("""python -c 'import sys; print(sys.argv[1:])' 'a b' '' c""")
    assert args.stdout.strip() == "['a b', '', 'c']"
    assert sbx.commands.run("command -v python3").stdout.strip() == "/usr/bin/python3"


def test_a_watch_allowing_network_mounts_is_the_same_watch(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/netwatch/f.txt", "before")
    handle = sbx.files.watch_dir("/home/user/netwatch", allow_network_mounts=True)  # envd 0.6.4
    try:
        sbx.files.write("/home/user/netwatch/f.txt", "after")
        assert (FilesystemEventType.WRITE, "f.txt") in [
            (e.type, e.name) for e in handle.get_new_events()
        ]
    finally:
        handle.stop()


def test_a_killed_process_is_gone_when_kill_returns(sbx: Sandbox) -> None:
    """E2B's test_kill_process runs `kill -0 PID` right after `commands.kill(pid)`: the pid
    must be reaped by then, not merely signalled (under load the reap can lag the signal)."""
    for _ in range(10):
        pid = sbx.commands.run("sleep 30", background=True).pid
        assert sbx.commands.kill(pid)
        assert pid not in [p.pid for p in sbx.commands.list()]
