"""Per-cell disk quota: the workspace is an ext4 image, loop-mounted on the cell's host dir.

A quota on one file (RLIMIT_FSIZE) does not stop many files from filling the host disk; a
filesystem of `disk_mb` does, with a plain ENOSPC. The image is sparse, so an idle cell costs
only what it wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

MKFS = (
    "mkfs.ext4",
    "-q",
    "-F",
    "-m",
    "0",
    "-O",
    "^has_journal,^resize_inode",
    "-E",
    "nodiscard,lazy_itable_init=1,root_owner={uid}:{uid}",
)
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"


class DiskError(Exception):
    pass


def run_checked(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DiskError(f"{argv[0]} failed: {result.stderr.strip() or result.returncode}")


def loop_quota_available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "loop mounts need root"
    if not Path("/dev/loop-control").exists():
        return False, "no /dev/loop-control"
    if shutil.which("mkfs.ext4") is None:
        return False, "mkfs.ext4 not installed (e2fsprogs)"
    return True, "ext4 image per workspace, loop-mounted"


def create_quota_workspace(image: Path, mountpoint: Path, size_mb: int, uid: int) -> None:
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    argv = [a.format(uid=uid) for a in MKFS]
    run_checked([*argv, str(image)])
    mountpoint.mkdir(mode=0o700, exist_ok=True)
    run_checked(["mount", "-o", MOUNT_OPTIONS, str(image), str(mountpoint)])
    with contextlib.suppress(FileNotFoundError):
        (mountpoint / "lost+found").rmdir()


def adopt_workspace(source: Path, mountpoint: Path, uid: int) -> None:
    """A kept workspace (an image, or a directory at `mountpoint` already) for a new cell
    whose host uid is `uid`: mounted, and its files handed to that uid (they belonged to the
    cell that made them; the tenant makes no file as anyone else)."""
    if source != mountpoint:
        mountpoint.mkdir(mode=0o700, exist_ok=True)
        run_checked(["mount", "-o", MOUNT_OPTIONS, str(source), str(mountpoint)])
    if mountpoint.stat().st_uid != uid:
        # -R without -L never follows a symlink: the tenant's links are chowned themselves.
        run_checked(["chown", "-R", "-P", f"{uid}:{uid}", str(mountpoint)])


def create_plain_workspace(mountpoint: Path, uid: int) -> None:
    mountpoint.mkdir(mode=0o700, exist_ok=True)
    os.chown(mountpoint, uid, uid)


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)


def release_workspace(mountpoint: Path) -> None:
    """Unmounts the workspace if mounted (the loop device is auto-cleared)."""
    if not is_mounted(mountpoint):
        return
    try:
        run_checked(["umount", str(mountpoint)])
    except DiskError:
        # Something still holds it open (a racing reader on the host): detach lazily so the
        # tree can be removed now; the kernel frees it when the last reference goes.
        run_checked(["umount", "--lazy", str(mountpoint)])
