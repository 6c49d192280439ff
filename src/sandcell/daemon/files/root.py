"""The cell's root as a read-only place of the cell-wide file table (SPEC §14.2): E2B's files
API lists `/` and reads system files, as E2B's own sandboxes let it.

Only a daemon that its cell's launcher started (`--in-cell`) has this place: its `/` is then
the cell's own mount view, which holds no host path (SPEC §3). Outside a cell `/` would be the
host's, and stays refused.

- Read-only: the table changes files in the workspace and /tmp alone (Places refuses the rest
  by name), whatever the mounts beneath would allow.
- Paths resolve as the cell resolves them (openat2 RESOLVE_IN_ROOT: an absolute symlink means
  the cell's root), never through a magic link (/proc/*/fd, /proc/*/root, ...).
- /proc is the daemon's own procfs: its own entries (/proc/self, its fds, its environment) are
  no caller's to read, so of /proc only a few files whose contents are the cell's or the
  machine's to tell, `PROC_READABLE`, are opened, and the directories above them are walked,
  not listed. The check is on the path the kernel gives the opened file, so no symlink
  elsewhere reaches further into /proc.
- Only directories and regular files are opened for reading: a device, fifo or socket is
  refused before anything opens it for real (an O_PATH handle first).
"""

from __future__ import annotations

import os
import stat

from sandcell.daemon.files.workspace import (
    RESOLVE_IN_ROOT,
    Workspace,
    fs_error,
    normal,
    openat2_beneath,
)
from sandcell.errors import ErrorCode, ServiceError

_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

PROC = "/proc"
# A cell's boot id (its own, SPEC §3: E2B's tests read it to tell a cold boot), and what
# `free`, `nproc`, `uptime` and `uname` read.
PROC_READABLE = frozenset(
    {
        "/proc/sys/kernel/random/boot_id",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/proc/loadavg",
        "/proc/uptime",
        "/proc/version",
    }
)
# A file of a pseudo filesystem reports size 0; it is read whole, up to this, when opened.
PSEUDO_FILE_LIMIT = 1_048_576


def _refused(path: str, why: str) -> ServiceError:
    return ServiceError(ErrorCode.FORBIDDEN, f"{path}: {why}", {"path": path})


def _proc_allows(real: str, flags: int) -> bool:
    """Whether `real`, a path in /proc, may be opened with `flags`."""
    if real in PROC_READABLE:
        return True
    # A directory above a readable file, only as a handle to walk or stat from.
    return flags & os.O_PATH != 0 and any(r.startswith(real + "/") for r in PROC_READABLE)


class CellRoot(Workspace):
    """The cell's `/`, read-only, resolved as the cell resolves it."""

    writable = False

    def __init__(self) -> None:
        super().__init__("/", place="the cell's root")

    def relative(self, path: str) -> str:
        normalised = normal(path)
        if not normalised.startswith("/"):
            raise _refused(path, "the cell's root takes absolute paths")
        return normalised.lstrip("/") or "."

    def open(self, rel: str, flags: int, mode: int = 0o644) -> int:
        shown = "/" if rel == "." else "/" + rel
        if flags & _WRITING:
            raise _refused(shown, "the cell's root is read-only to the files API")
        _check_proc(shown, flags)  # by name first, so the refusal says why
        try:
            handle = openat2_beneath(self.root_fd, rel, os.O_PATH, resolve=RESOLVE_IN_ROOT)
        except OSError as exc:
            raise fs_error(exc, shown, self.place) from exc
        try:
            _check_proc(shown, flags, os.readlink(f"/proc/self/fd/{handle}"))
            if flags & os.O_PATH:
                return os.dup(handle)
            st = os.fstat(handle)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise ServiceError(
                    ErrorCode.BAD_REQUEST, f"{shown}: not a regular file", {"path": shown}
                )
            try:  # the handle's own file, opened for reading: nothing is resolved again
                fd = os.open(f"/proc/self/fd/{handle}", flags | os.O_CLOEXEC)
            except OSError as exc:
                raise fs_error(exc, shown, self.place) from exc
            if stat.S_ISREG(st.st_mode) and st.st_size == 0:  # /proc's files tell no size
                return read_whole(fd, shown)
            return fd
        finally:
            os.close(handle)


def _check_proc(shown: str, flags: int, real: str = "") -> None:
    """Refuses `shown` if it, or `real` (the path the kernel gives the opened file), lies in
    /proc beyond what `flags` may open there."""
    for path in (shown, real):
        if (path == PROC or path.startswith(PROC + "/")) and not _proc_allows(path, flags):
            listed = ", ".join(sorted(PROC_READABLE))
            raise _refused(shown, f"of {PROC}, the files API reads only {listed}")


def read_whole(fd: int, path: str) -> int:
    """A file that reports size 0 (procfs) read whole into an anonymous file, whose size is
    the answer's length; `fd` is closed."""
    data = b""
    try:
        while len(data) <= PSEUDO_FILE_LIMIT and (chunk := os.read(fd, 65536)):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > PSEUDO_FILE_LIMIT:
        raise ServiceError(
            ErrorCode.BAD_REQUEST, f"{path}: larger than {PSEUDO_FILE_LIMIT} bytes", {"path": path}
        )
    copy = os.memfd_create("sandcell-read", os.MFD_CLOEXEC)
    os.write(copy, data)
    os.lseek(copy, 0, os.SEEK_SET)
    return copy
