"""Files and lifecycle through the unmodified e2b SDK, sync and async."""

from __future__ import annotations

import asyncio
import io

import pytest
from e2b import AsyncSandbox, FileType, Sandbox, SandboxQuery
from e2b.exceptions import InvalidArgumentException, NotFoundException, SandboxException
from e2b.sandbox.filesystem.filesystem import WriteEntry

from sandcell.compat.e2b.files import MAX_UPLOAD

pytestmark = pytest.mark.slow


def test_write_read_info_rename_remove(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/data/report.txt", "v1")
    assert info.path == "/home/user/data/report.txt"
    sbx.files.write("data/blob.bin", b"\x00\xff" * 1000)
    assert sbx.files.read("/home/user/data/blob.bin", format="bytes") == b"\x00\xff" * 1000
    entry = sbx.files.get_info("/home/user/data/report.txt")
    assert (entry.name, entry.type, entry.size) == ("report.txt", FileType.FILE, 2)
    moved = sbx.files.rename("/home/user/data/report.txt", "/home/user/data/final.txt")
    assert moved.path == "/home/user/data/final.txt"
    assert not sbx.files.exists("/home/user/data/report.txt")
    assert sbx.files.read("/home/user/data/final.txt") == "v1"
    sbx.files.remove("/home/user/data/final.txt")
    assert not sbx.files.exists("/home/user/data/final.txt")


def test_make_dir_and_list(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("/home/user/tree/a/b") is True
    assert sbx.files.make_dir("/home/user/tree/a/b") is False  # already there
    sbx.files.write("/home/user/tree/a/file.txt", "x")
    names = {(e.name, e.type) for e in sbx.files.list("/home/user/tree/a")}
    assert names == {("b", FileType.DIR), ("file.txt", FileType.FILE)}
    deep = {e.path for e in sbx.files.list("/home/user/tree", depth=3)}
    assert "/home/user/tree/a/b" in deep


def test_missing_file_and_paths_outside_home(sbx: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/nothing-here")
    with pytest.raises(SandboxException, match="outside"):
        sbx.files.read("../escape")  # relative is the workspace's; / is the cell's, read-only
    with pytest.raises(InvalidArgumentException):
        sbx.files.list("")
    with pytest.raises(SandboxException):
        sbx.files.write("/etc/planted", "x")
    # A symlink made by a command inside the sandbox does not lead the file API out of it.
    sbx.commands.run("ln -s /etc /workspace/etc-link")
    for through in ("/home/user/etc-link/passwd", "etc-link/hostname"):
        with pytest.raises(SandboxException):
            sbx.files.read(through)
    with pytest.raises(SandboxException):
        sbx.files.write("/home/user/etc-link/planted", "x")


def test_gzip_upload_and_download(sbx: Sandbox) -> None:
    text = "compressible " * 1000
    sbx.files.write("/home/user/z.txt", text, gzip=True)
    assert sbx.files.read("/home/user/z.txt", gzip=True) == text


def test_large_uploads(sbx: Sandbox) -> None:
    """Raw (octet-stream) uploads stream through the router, past the bound that forms have:
    the SDK sends str and bytes as a form unless asked, or given a file object."""
    size = MAX_UPLOAD + (8 << 20)
    sbx.files.write("/home/user/big.bin", io.BytesIO(b"\x01" * size))
    assert sbx.files.get_info("/home/user/big.bin").size == size
    sbx.files.write("/home/user/big2.bin", b"\x02" * size, use_octet_stream=True)
    assert sbx.files.get_info("/home/user/big2.bin").size == size
    with pytest.raises(SandboxException, match="413"):
        sbx.files.write("/home/user/big3.bin", b"\x03" * size)


def test_several_files_at_once(sbx: Sandbox) -> None:
    written = sbx.files.write_files(
        [
            WriteEntry(path="/home/user/many/one.txt", data="1"),
            WriteEntry(path="many/two.bin", data=b"\x02"),
        ]
    )
    assert sorted(w.path for w in written) == ["/home/user/many/one.txt", "/home/user/many/two.bin"]
    assert sbx.files.read("/home/user/many/two.bin", format="bytes") == b"\x02"


def test_list_filters_by_metadata() -> None:
    one = Sandbox.create(metadata={"purpose": "files"})
    other = Sandbox.create(metadata={"purpose": "other thing"})
    try:
        mine = SandboxQuery(metadata={"purpose": "files"})
        assert [s.sandbox_id for s in Sandbox.list(query=mine).next_items()] == [one.sandbox_id]
        theirs = SandboxQuery(metadata={"purpose": "other thing"})
        assert [s.sandbox_id for s in Sandbox.list(query=theirs).next_items()] == [other.sandbox_id]
        assert one.get_info().metadata == {"purpose": "files"}
    finally:
        one.kill()
        other.kill()


def test_timeout_and_info(sbx: Sandbox) -> None:
    sbx.set_timeout(200)
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert (info.cpu_count, info.memory_mb) == (1, 256)  # the template's limits
    assert sbx.is_running()


def test_async_sandbox() -> None:
    async def scenario() -> None:
        sandbox = await AsyncSandbox.create()
        try:
            await sandbox.files.write("hello.py", "print('from async')")
            result = await sandbox.commands.run("python3 hello.py")
            assert result.stdout == "from async\n"
            seen: list[str] = []
            handle = await sandbox.commands.run(
                "python3 hello.py", background=True, on_stdout=seen.append
            )
            assert (await handle.wait()).exit_code == 0
            assert "".join(seen) == "from async\n"
        finally:
            await sandbox.kill()

    asyncio.run(scenario())
