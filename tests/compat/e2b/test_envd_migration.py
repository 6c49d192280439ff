"""Issue 27's envd items through the unmodified e2b SDK: stdin kept open for `cat`, E2B's file
info and user metadata, removing a missing path, recursive watches with entry info, and
older SDKs that call envd without `E2b-Sandbox-Id`."""

from __future__ import annotations

import time

import pytest
from e2b import FilesystemEventType, FileType, Sandbox
from e2b.envd.process import process_pb
from e2b.sandbox.commands.command_handle import CommandExitException

pytestmark = pytest.mark.slow


def test_stdin_kept_open_for_cat(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "hello\n")
    sbx.commands.close_stdin(handle.pid)
    assert "hello" in handle.wait().stdout


def test_stdin_kept_open_then_killed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    time.sleep(1)
    sbx.commands.send_stdin(handle.pid, "hello\n")
    time.sleep(1)
    handle.kill()
    with pytest.raises(CommandExitException) as exc:
        handle.wait()
    assert "hello" in exc.value.stdout


def test_stdin_open_when_the_request_does_not_say(sbx: Sandbox) -> None:
    """envd's default: a StartRequest without `stdin` (SDKs from before envd 0.3.0) keeps
    stdin open; `stdin: false`, which today's SDKs send by default, gives none."""
    request = process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="/bin/cat"))
    assert "stdin" not in request.to_json()
    # The SDK's own start path (its Connect client and handle), minus the field.
    handle = sbx.commands._create_handle(sbx.commands._rpc.start(request), "start", True)
    sbx.commands.send_stdin(handle.pid, "hello\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "hello\n"
    closed = sbx.commands.run("cat", background=True, stdin=False)
    assert closed.wait().stdout == ""


def test_file_info_carries_e2bs_fields(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/info/a.txt", "abc")
    sbx.commands.run("chmod 640 info/a.txt && ln -s a.txt info/link")  # the workspace
    info = sbx.files.get_info("/home/user/info/a.txt")
    assert (info.type, info.size, info.mode) == (FileType.FILE, 3, 0o640)
    assert info.permissions == "-rw-r-----"
    assert info.owner and info.group
    assert info.modified_time.year >= 2024
    assert info.symlink_target is None
    link = sbx.files.get_info("/home/user/info/link")  # followed, as envd does
    assert link.type == FileType.FILE
    assert link.symlink_target == "/home/user/info/a.txt"


def test_metadata_kept_on_write_stat_list_and_rename(sbx: Sandbox) -> None:
    written = sbx.files.write("/home/user/meta/m.txt", "x", metadata={"Owner": "agent-7"})
    assert written.metadata == {"owner": "agent-7"}
    assert sbx.files.get_info("/home/user/meta/m.txt").metadata == {"owner": "agent-7"}
    listed = {e.name: e.metadata for e in sbx.files.list("/home/user/meta")}
    assert listed == {"m.txt": {"owner": "agent-7"}}
    moved = sbx.files.rename("/home/user/meta/m.txt", "/home/user/meta/n.txt")
    assert moved.metadata == {"owner": "agent-7"}
    assert sbx.files.get_info("/home/user/meta/n.txt").metadata == {"owner": "agent-7"}
    assert sbx.files.get_info("/home/user/meta").metadata is None


def test_removing_a_missing_path_is_done(sbx: Sandbox) -> None:
    sbx.files.remove("/home/user/never-was")
    sbx.files.write("/home/user/gone.txt", "x")
    sbx.files.remove("/home/user/gone.txt")
    sbx.files.remove("/home/user/gone.txt")
    assert not sbx.files.exists("/home/user/gone.txt")


def test_recursive_watch_sees_new_folders_with_entry_info(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched")
    handle = sbx.files.watch_dir("/home/user/watched", recursive=True, include_entry=True)
    events = []
    try:
        sbx.files.make_dir("/home/user/watched/later/deeper")
        time.sleep(0.5)  # seen as a folder of its own before anything lands in it
        sbx.files.write("/home/user/watched/later/deeper/f.txt", "hi")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e.name.endswith("f.txt") for e in events):
            events += handle.get_new_events()
            time.sleep(0.2)
    finally:
        handle.stop()
    names = {e.name for e in events if e.type == FilesystemEventType.CREATE}
    assert {"later", "later/deeper", "later/deeper/f.txt"} <= names, events
    created = next(e for e in events if e.name == "later/deeper/f.txt")
    assert created.entry is not None, created
    assert created.entry.type == FileType.FILE and created.entry.size == 2
    folder = next(e for e in events if e.name == "later/deeper")
    assert folder.entry is not None and folder.entry.type == FileType.DIR
