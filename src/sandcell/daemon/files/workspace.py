"""Race-free confinement of file paths to a directory: the workspace (SPEC §2.4), or the
cell's /tmp for the E2B façade (SPEC §14.2).

Every path is resolved by the kernel with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
from an fd of the directory's root, so `..`, absolute symlinks and symlinks (existing or
swapped in concurrently) that lead outside fail with EXDEV instead of being followed.
Operations on a final name (mkdir, rename, unlink) go through an fd of its already-confined
parent.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager

from sandcell.errors import ErrorCode, ServiceError

_SYS_OPENAT2 = 437  # the same number on every architecture (asm-generic)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10  # `..` stops at the directory; an absolute symlink starts from it
_RENAME_NOREPLACE = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2_beneath(
    dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = _RESOLVE_BENEATH
) -> int:
    """openat2 from `dir_fd`, never through a magic link; `resolve` says how `..` and
    absolute symlinks are taken (beneath the directory by default)."""
    # openat2 is strict: a mode without O_CREAT is EINVAL.
    mode = mode if flags & os.O_CREAT else 0
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        _SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


_ERRNO_CODES = {
    errno.ENOENT: ErrorCode.FILE_NOT_FOUND,
    errno.EXDEV: ErrorCode.FORBIDDEN,
    errno.ELOOP: ErrorCode.FORBIDDEN,
    errno.EACCES: ErrorCode.FORBIDDEN,
    errno.EPERM: ErrorCode.FORBIDDEN,
    errno.EROFS: ErrorCode.FORBIDDEN,
    errno.EEXIST: ErrorCode.CONFLICT,
    errno.ENOTEMPTY: ErrorCode.CONFLICT,
    errno.EBUSY: ErrorCode.CONFLICT,
    errno.ENOTDIR: ErrorCode.BAD_REQUEST,
    errno.EISDIR: ErrorCode.BAD_REQUEST,
    errno.EINVAL: ErrorCode.BAD_REQUEST,
    errno.ENAMETOOLONG: ErrorCode.BAD_REQUEST,
    errno.ENXIO: ErrorCode.BAD_REQUEST,  # a socket file: nothing to read
    errno.ENODEV: ErrorCode.BAD_REQUEST,
    errno.ENOSPC: ErrorCode.PAYLOAD_TOO_LARGE,
    errno.EDQUOT: ErrorCode.PAYLOAD_TOO_LARGE,
    errno.EFBIG: ErrorCode.PAYLOAD_TOO_LARGE,
}


def fs_error(exc: OSError, path: str, place: str = "the workspace") -> ServiceError:
    """The caller-facing error for a failed file operation on `path`, beneath `place`."""
    code = _ERRNO_CODES.get(exc.errno or 0, ErrorCode.INTERNAL)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno in (errno.EXDEV, errno.ELOOP):
        reason = f"path leads outside {place}"
    return ServiceError(code, f"{path}: {reason}", {"path": path})


def _forbidden(path: str, why: str) -> ServiceError:
    return ServiceError(ErrorCode.FORBIDDEN, f"{path}: {why}", {"path": path})


def normal(path: str) -> str:
    """`path` lexically normalised, an absolute one with a single leading slash (POSIX keeps
    `//x` apart from `/x`; the kernel does not)."""
    if "\0" in path:
        raise ServiceError(ErrorCode.BAD_REQUEST, "path contains a NUL byte")
    normalised = posixpath.normpath(path or ".")
    return "/" + normalised.lstrip("/") if normalised.startswith("/") else normalised


def _beneath(path: str, name: str) -> str | None:
    """`path` (absolute, normalised) relative to the directory `name`, or None outside it."""
    if path == name:
        return "."
    return path[len(name) + 1 :] if path.startswith(name.rstrip("/") + "/") else None


class Workspace:
    """A directory held open (the workspace, or the cell's /tmp); all access goes through its
    fd. `aliases` are other names the cell gives it (cellapi.layout): each is kept only if it
    is the same directory, checked once here."""

    writable = True  # the file table may change what lies beneath (files/root.py: not)

    def __init__(self, root: str, aliases: tuple[str, ...] = (), place: str = "") -> None:
        self.root = posixpath.normpath(root)
        self.root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        # Fail closed at start-up: no openat2 means no race-free confinement.
        os.close(openat2_beneath(self.root_fd, ".", os.O_PATH))
        self.place = place or "the workspace"  # how errors name it
        own = os.stat(self.root_fd)
        self.names = (self.root, *(a for a in aliases if _same_directory(a, own)))

    def relative(self, path: str) -> str:
        """The lexically normalised root-relative path ('.' is the root); an absolute path
        must lie under one of the directory's names."""
        rel = normal(path)
        if rel.startswith("/"):
            for name in self.names:
                if (beneath := _beneath(rel, name)) is not None:
                    return beneath
            raise _forbidden(path, f"path leads outside {self.place}")
        if rel == ".." or rel.startswith("../"):
            raise _forbidden(path, f"path leads outside {self.place}")
        return rel

    def directory(self, path: str, home: str = "") -> str:
        """The absolute path of an existing directory beneath the root (a working directory
        for a process: 403 outside, 404 missing), under the name the path used; a relative
        path under `home`, one of the names (default: the root)."""
        rel = self.relative(path)
        with self.fd(rel, os.O_PATH | os.O_DIRECTORY):
            pass  # proves the directory exists beneath the root
        normalised = normal(path)
        name = next((n for n in self.names if _beneath(normalised, n) is not None), "")
        if not name:
            name = home if home in self.names else self.root
        return posixpath.join(name, rel) if rel != "." else name

    def open(self, rel: str, flags: int, mode: int = 0o644) -> int:
        try:
            return openat2_beneath(self.root_fd, rel, flags, mode)
        except OSError as exc:
            raise fs_error(exc, rel, self.place) from exc

    @contextmanager
    def fd(self, rel: str, flags: int, mode: int = 0o644) -> Iterator[int]:
        fd = self.open(rel, flags, mode)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent(self, rel: str) -> Iterator[tuple[int, str]]:
        """An O_PATH fd of `rel`'s confined parent directory, and the final name."""
        if rel == ".":
            raise _forbidden(rel, f"{self.place} itself cannot be changed")
        head, name = posixpath.split(rel)
        with self.fd(head or ".", os.O_PATH | os.O_DIRECTORY) as dir_fd:
            yield dir_fd, name

    def makedirs(self, rel: str, mode: int = 0o755) -> None:
        """mkdir -p, each component created under its confined parent."""
        parts = [] if rel == "." else rel.split("/")
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            with self.parent(sub) as (dir_fd, name):
                try:
                    os.mkdir(name, mode, dir_fd=dir_fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise fs_error(exc, sub, self.place) from exc

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        with self.parent(src) as (src_fd, src_name), self.parent(dst) as (dst_fd, dst_name):
            if overwrite:
                try:
                    os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except OSError as exc:
                    raise fs_error(exc, dst, self.place) from exc
                return
            flags = _RENAME_NOREPLACE
            if (
                _libc.renameat2(src_fd, os.fsencode(src_name), dst_fd, os.fsencode(dst_name), flags)
                != 0
            ):
                err = ctypes.get_errno()
                where = dst if err == errno.EEXIST else src
                raise fs_error(OSError(err, os.strerror(err)), where, self.place)


def _same_directory(path: str, own: os.stat_result) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
