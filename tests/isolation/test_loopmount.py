"""Workspace images mounted with the kernel's loop and mount calls: mounted with the options
the cells rely on, and nothing left attached, whether the mount worked or failed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sandcell.isolation import disk

pytestmark = pytest.mark.skipif(not disk.loop_quota_available()[0], reason="needs loop mounts")


def _attached(image: Path) -> list[str]:
    """Loop devices backed by `image` now."""
    found = []
    for entry in Path("/sys/block").glob("loop*"):
        backing = entry / "loop" / "backing_file"
        if backing.exists() and backing.read_text().strip().startswith(str(image)):
            found.append(entry.name)
    return found


def _mount_options(target: Path) -> set[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(target):
            return set(fields[5].split(","))
    raise AssertionError(f"{target} is not mounted")


def test_workspace_mounts_nosuid_nodev_and_detaches_on_release(tmp_path: Path) -> None:
    image, target = tmp_path / "disk.img", tmp_path / "workspace"
    disk.create_quota_workspace(image, target, 16, 4242)
    try:
        assert {"rw", "nosuid", "nodev", "noatime"} <= _mount_options(target)
        assert target.stat().st_uid == 4242
        (target / "f").write_bytes(b"x" * 4096)
        assert len(_attached(image)) == 1
    finally:
        disk.release_workspace(target)
    assert not disk.is_mounted(target)
    assert _attached(image) == []


def test_a_file_that_is_no_filesystem_fails_clearly_and_frees_its_device(tmp_path: Path) -> None:
    image, target = tmp_path / "garbage.img", tmp_path / "m"
    image.write_bytes(os.urandom(1 << 20))
    target.mkdir()
    with pytest.raises(disk.DiskError, match="mount"):
        disk.mount_image(image, target)
    assert not disk.is_mounted(target)
    assert _attached(image) == []


def test_read_only_mount_refuses_writes(tmp_path: Path) -> None:
    image, rw, ro = tmp_path / "disk.img", tmp_path / "rw", tmp_path / "ro"
    disk.create_quota_workspace(image, rw, 16, 0)
    (rw / "kept").write_text("yes")
    disk.release_workspace(rw)
    ro.mkdir()
    disk.mount_image(image, ro, read_only=True)
    try:
        assert "ro" in _mount_options(ro)
        assert (ro / "kept").read_text() == "yes"
        with pytest.raises(OSError) as caught:
            (ro / "new").write_text("no")
        assert caught.value.errno == errno.EROFS
    finally:
        disk.release_workspace(ro)
    assert _attached(image) == []
