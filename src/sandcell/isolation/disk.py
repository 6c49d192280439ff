"""Per-cell disk quota: the workspace is an ext4 image, loop-mounted on the cell's host dir.

A quota on one file (RLIMIT_FSIZE) does not stop many files from filling the host disk; a
filesystem of `disk_mb` does, with a plain ENOSPC. The image is sparse, so an idle cell costs
only what it wrote.

It stays so when the tenant deletes, though the filesystem is mounted without `discard`
(online discard made 5,000 unlinks 8x slower): the blocks of deleted files stay allocated in
the image until they are handed back with a trim (FITRIM: the loop device
punches them out of the image). That is done where it pays: before a workspace is unmounted
(kept for a pause, it costs disk for days) and before it is measured or copied for a snapshot,
and only when the image holds notably more than its files do.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import struct
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


log = logging.getLogger("sandcell.isolation.disk")
# A trim runs only when the image holds this much more than the filesystem's used blocks: a
# fresh image's metadata (a few MiB) is never worth one, a deleted build tree or log is.
TRIM_SLACK_BYTES = 16 * 1024 * 1024
_FITRIM = 0xC0185879  # _IOWR('X', 121, struct fstrim_range {u64 start, len, minlen})
_NO_TRIM = (errno.EOPNOTSUPP, errno.ENOTTY, errno.EROFS, errno.EINVAL)


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
    """Unmounts the workspace if mounted (the loop device is auto-cleared), its freed blocks
    handed back to the host first: the image may be kept (a pause) rather than deleted."""
    if not is_mounted(mountpoint):
        return
    give_back_freed(mountpoint)
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
    """Everything written to the workspace's filesystem reaches its image (syncfs(2)), and
    what deleted files held leaves it: the image's blocks are then what a copy costs."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {mountpoint}: {os.strerror(err)}")
    finally:
        os.close(fd)
    give_back_freed(mountpoint)


def image_of(mountpoint: Path) -> Path | None:
    """The image file a loop-mounted workspace lives in; None for a plain directory."""
    dev = os.stat(mountpoint).st_dev
    backing = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/loop/backing_file")
    try:
        return Path(backing.read_text().strip())
    except OSError:
        return None


def give_back_freed(mountpoint: Path) -> None:
    """Trims a loop-mounted workspace whose image holds more than TRIM_SLACK_BYTES beyond
    its filesystem's used blocks. Never fails the caller (a pause, a snapshot, a deletion):
    the image is only bigger than it needs to be, and that is logged."""
    try:
        image = image_of(mountpoint)
        fs = os.statvfs(mountpoint)
        if image is None or fs.f_flag & os.ST_RDONLY:
            return
        used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        if image.stat().st_blocks * 512 - used <= TRIM_SLACK_BYTES:
            return
        fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, _FITRIM, bytearray(struct.pack("QQQ", 0, 2**64 - 1, 0)))
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno not in _NO_TRIM:
            log.warning("workspace %s: freed blocks not given back: %s", mountpoint, exc)


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
