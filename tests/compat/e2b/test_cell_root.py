"""The cell's root through E2B's files API (SPEC §14.2): `files.list("/")` and reads of system
files, as on E2B (agno's `list_files()` lists `/`; E2B's own tests read the boot id), from the
cell's own mount view, read-only, with only a few files of /proc. Driven by the unmodified
e2b SDK against a real server; the daemon outside a cell still refuses `/`
(tests/daemon/test_cell_files.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import FileType, Sandbox
from e2b.exceptions import InvalidArgumentException, NotFoundException, SandboxException

from support.server import RunningServer

pytestmark = pytest.mark.slow


def _names_by_command(sbx: Sandbox, directory: str) -> set[str]:
    return set(sbx.commands.run(f"ls -A {directory}").stdout.split())


def test_the_root_is_the_cells_own(sbx: Sandbox, e2b_server: RunningServer) -> None:
    listed = sbx.files.list("/")
    assert {e.name for e in listed} == _names_by_command(sbx, "/")
    assert {"home", "tmp", "usr", "proc", "workspace"} <= {e.name for e in listed}
    by_name = {e.name: e for e in listed}
    assert by_name["usr"].path == "/usr" and by_name["usr"].type == FileType.DIR
    # Nothing of the host: its data directory is named nowhere in the cell.
    assert not sbx.files.exists(str(e2b_server.data_dir))


def test_system_files_read_as_commands_read_them(sbx: Sandbox) -> None:
    for path in ("/etc/passwd", "/etc/os-release", "//etc/passwd", "/tmp/../etc/passwd"):
        assert sbx.files.read(path) == sbx.commands.run(f"cat {path}").stdout, path
    info = sbx.files.get_info("/etc")
    assert info.type == FileType.DIR and info.path == "/etc"
    with pytest.raises(NotFoundException):
        sbx.files.read("/etc/no-such-file")


def test_the_boot_id_and_a_few_files_of_proc(sbx: Sandbox) -> None:
    boot_id = sbx.files.read("/proc/sys/kernel/random/boot_id")
    assert boot_id == sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
    assert len(boot_id.strip()) == 36
    assert boot_id != Path("/proc/sys/kernel/random/boot_id").read_text()  # not the host's
    assert sbx.files.read("/proc/meminfo").startswith("MemTotal:")
    assert sbx.files.get_info("/proc").type == FileType.DIR


@pytest.mark.parametrize(
    "path",
    ["/proc/self/environ", "/proc/1/environ", "/proc/self/mountinfo", "/proc/self/fd/0"],
)
def test_the_daemons_own_proc_is_not_read(sbx: Sandbox, path: str) -> None:
    with pytest.raises(SandboxException, match="files API reads only"):
        sbx.files.read(path)


def test_proc_is_not_listed_nor_reached_by_a_link(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="files API reads only"):
        sbx.files.list("/proc")
    with pytest.raises(SandboxException, match="files API reads only"):
        sbx.files.list("/proc/self/fd")
    # /dev/shm is writable in the cell and not a place of its own: the link is followed
    # as the cell follows it, to the daemon's own /proc entry, and refused there.
    sbx.commands.run("ln -sfn /proc/self/environ /dev/shm/env && ln -sfn /proc/self /dev/shm/me")
    with pytest.raises(SandboxException, match="files API reads only"):
        sbx.files.read("/dev/shm/env")
    with pytest.raises(SandboxException, match="files API reads only"):
        sbx.files.read("/dev/shm/me/environ")
    # A deeper listing of the root names /proc and goes on past it.
    deep = sbx.files.list("/", depth=2)
    assert "/proc" in {e.path for e in deep}
    assert not [e.path for e in deep if e.path.startswith("/proc/")]
    assert "/usr/bin" in {e.path for e in deep}


def test_devices_are_not_read(sbx: Sandbox) -> None:
    for path in ("/dev/zero", "/dev/null", "/dev/ptmx"):
        with pytest.raises(InvalidArgumentException, match="not a regular file"):
            sbx.files.read(path)


@pytest.mark.parametrize("path", ["/0/multi.txt", "/etc/planted", "/etc/passwd", "/usr/x"])
def test_the_root_is_read_only(sbx: Sandbox, path: str) -> None:
    before = sbx.commands.run("cat /etc/passwd").stdout
    with pytest.raises(SandboxException, match="the cell's root is read-only to the files API"):
        sbx.files.write(path, "x")
    with pytest.raises(SandboxException, match="read-only"):
        sbx.files.make_dir(f"{path}.d")
    with pytest.raises(SandboxException, match="read-only"):
        sbx.files.remove("/etc/hostname")
    with pytest.raises(SandboxException, match="read-only"):
        sbx.files.rename("/etc/hostname", "/etc/moved")
    assert sbx.commands.run("cat /etc/passwd").stdout == before
    assert sbx.commands.run("test -e /etc/hostname && test ! -e /0 && echo ok").stdout == "ok\n"
