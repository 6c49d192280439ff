"""Per-cell disk quota: the workspace is an ext4 image, loop-mounted on the cell's host dir.

A quota on one file (RLIMIT_FSIZE) does not stop many files from filling the host disk; a
filesystem of `disk_mb` does, with a plain ENOSPC. The image is sparse, so an idle cell costs
only what it wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

from sandcell.isolation import loopmount

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
    mount_image(image, mountpoint)
    with contextlib.suppress(FileNotFoundError):
        (mountpoint / "lost+found").rmdir()


def adopt_workspace(source: Path, mountpoint: Path, uid: int) -> None:
    """A kept workspace (an image, or a directory at `mountpoint` already) for a new cell
    whose host uid is `uid`: mounted, and its files handed to that uid (they belonged to the
    cell that made them; the tenant makes no file as anyone else)."""
    if source != mountpoint:
        mountpoint.mkdir(mode=0o700, exist_ok=True)
        mount_image(source, mountpoint)
    if mountpoint.stat().st_uid != uid:
        # -R without -L never follows a symlink: the tenant's links are chowned themselves.
        run_checked(["chown", "-R", "-P", f"{uid}:{uid}", str(mountpoint)])


def mount_image(image: Path, mountpoint: Path, read_only: bool = False) -> None:
    try:
        loopmount.mount_image(image, mountpoint, read_only)
    except OSError as exc:
        raise DiskError(str(exc)) from exc


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
        loopmount.unmount(mountpoint)
    except OSError:
        # Something still holds it open (a racing reader on the host): detach lazily so the
        # tree can be removed now; the kernel frees it when the last reference goes.
        try:
            loopmount.unmount(mountpoint, lazy=True)
        except OSError as exc:
            raise DiskError(str(exc)) from exc


def allocated_bytes(path: Path) -> int:
    """What a workspace (an image or a directory) takes on disk: a sparse image's holes are
    free, so this, not its apparent size, is what a copy of it costs."""
    if not path.is_dir():
        return path.stat().st_blocks * 512
    total = 0
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def sync_filesystem(mountpoint: Path) -> None:
    """Everything written to the workspace's filesystem reaches its image (syncfs(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {mountpoint}: {os.strerror(err)}")
    finally:
        os.close(fd)


def copy_workspace(source: Path, dest: Path) -> int:
    """A copy of a workspace at `dest`, published whole by a rename (a crash leaves at most a
    `.partial` beside it); holes stay holes, and blocks are shared where the filesystem can
    (reflink). Returns the bytes the copy takes. Fails cleanly (nothing left) on ENOSPC."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    try:
        run_checked(
            ["cp", "-a", "--sparse=always", "--reflink=auto", "-T", str(source), str(partial)]
        )
        os.rename(partial, dest)
    except BaseException:
        remove_tree(partial)
        raise
    return allocated_bytes(dest)


def remove_tree(path: Path) -> None:
    """Deletes a workspace or a copy of one, image or directory; no-op if absent."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
