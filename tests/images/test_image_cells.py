"""Cells of a built image: the image is / (read-only), the daemon runs on the host's runtime
staged beside it, and the cell's own places are as in §3."""

from __future__ import annotations

from pathlib import Path

from cells.conftest import Cell
from sandcell.isolation.images.build import Builder
from support.oci import OS_RELEASE


def test_commands_see_the_images_os_release_not_the_hosts(cell: Cell) -> None:
    r = cell.run(["/bin/cat", "/etc/os-release"])
    assert r["exit_code"] == 0, r
    assert r["stdout"].encode() == OS_RELEASE
    assert Path("/etc/os-release").read_bytes() != OS_RELEASE


def test_the_image_has_no_python_yet_the_daemon_runs(cell: Cell) -> None:
    r = cell.sh("ls /usr/bin/python3 /usr 2>&1; echo $IMAGE_VAR; id -u")
    assert "No such file" in r["stdout"], r
    assert r["stdout"].split()[-2:] == ["from-oci", "1000"]


def test_the_image_is_read_only_and_workspace_tmp_are_writable(cell: Cell) -> None:
    r = cell.sh("echo x > /etc/os-release; echo x > /bin/new; echo $?")
    assert r["stdout"].strip() == "1", r
    r = cell.sh("echo ok > /workspace/f && echo ok > /tmp/f && cat /workspace/f /tmp/f")
    assert r["stdout"] == "ok\nok\n", r


def test_the_host_is_not_visible(cell: Cell) -> None:
    r = cell.sh("ls /; ls /root /home 2>&1; cat /etc/passwd")
    listing = r["stdout"]
    assert "root:x:0:0" in listing and "sandbox:x:1000" in listing
    assert "No such file" in listing  # neither the host's /root nor /home


def test_mountinfo_shows_no_path_of_the_image_store(cell: Cell, builder: Builder) -> None:
    """The image is a filesystem of its own (and, as root, staged through an overlay): its
    mounts show a path inside the image, never where the data directory keeps it."""
    lines = cell.run(["/bin/cat", "/proc/self/mountinfo"])["stdout"].splitlines()
    image_mounts = {f[4]: (f[3], f[-2]) for f in (line.split() for line in lines)}
    for point in ("/bin", "/etc", "/usr", "/sbin"):
        root, source = image_mounts[point]
        assert root == point and not source.startswith("/"), (point, root, source)
    assert str(builder.store.root) not in "\n".join(lines)
