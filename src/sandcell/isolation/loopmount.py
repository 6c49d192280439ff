"""Mounting a workspace image on a loop device with the kernel's own calls.

`mount -o loop` forks a process that parses fstab and mountinfo before making the same
three calls; on a cell's start path that is several milliseconds for nothing. The loop device
is configured with `LO_FLAGS_AUTOCLEAR`, so it detaches itself when its last user goes: the
mount once unmounted, or this module's descriptor if the mount fails.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_READ_ONLY, _LO_FLAGS_AUTOCLEAR = 1, 4
# struct loop_config: fd and block_size (u32 each), struct loop_info64 (232 bytes, lo_flags
# at offset 52), 64 reserved bytes.
_LOOP_INFO64_SIZE = 232
_LO_FLAGS_OFFSET = 52
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOATIME = 0x1, 0x2, 0x4, 0x400
_MNT_DETACH = 0x2
_ATTACH_TRIES = 16  # another process may take the free device between asking and using it


def _loop_config(image_fd: int, read_only: bool) -> bytes:
    info = bytearray(_LOOP_INFO64_SIZE)
    flags = _LO_FLAGS_AUTOCLEAR | (_LO_FLAGS_READ_ONLY if read_only else 0)
    struct.pack_into("I", info, _LO_FLAGS_OFFSET, flags)
    return struct.pack("II", image_fd, 0) + bytes(info) + bytes(64)


def _attach(image_fd: int, read_only: bool) -> tuple[str, int]:
    """(a free loop device now backed by `image_fd`, an open descriptor of it)."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(_ATTACH_TRIES):
            device = f"/dev/loop{fcntl.ioctl(control, _LOOP_CTL_GET_FREE)}"
            loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop_fd, _LOOP_CONFIGURE, _loop_config(image_fd, read_only))
            except OSError as exc:
                os.close(loop_fd)
                if exc.errno == errno.EBUSY:
                    continue
                raise
            return device, loop_fd
    finally:
        os.close(control)
    raise OSError(errno.EBUSY, "no free loop device after several tries")


def mount_image(image: Path, target: Path, read_only: bool = False) -> None:
    """Mounts the ext4 `image` on `target`, nosuid, nodev, noatime."""
    image_fd = os.open(image, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)
    try:
        device, loop_fd = _attach(image_fd, read_only)
    finally:
        os.close(image_fd)
    try:
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOATIME | (_MS_RDONLY if read_only else 0)
        if _libc.mount(device.encode(), os.fsencode(target), b"ext4", flags, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {image} on {target}: {os.strerror(err)}")
    finally:
        os.close(loop_fd)  # the mount holds the device now; on failure this detaches it


def unmount(target: Path, lazy: bool = False) -> None:
    """`lazy` detaches the mount now and lets the kernel free it once nothing holds it."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH if lazy else 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unmount {target}: {os.strerror(err)}")
