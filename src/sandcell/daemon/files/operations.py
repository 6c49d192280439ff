"""File operations on confined places: entries, listing, streamed reads and writes."""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import os
import posixpath
import pwd
import secrets
import shutil
import stat
from collections.abc import AsyncIterable, AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Literal, TypedDict

from sandcell.daemon.files.places import Places
from sandcell.daemon.files.workspace import Workspace, fs_error
from sandcell.errors import ErrorCode, ServiceError

# Downloads are read in the event loop, a MiB at a time (page cache: ~0.2 ms a read): a
# worker thread per chunk cost the daemon twice the CPU, and a cell out of pids (a fork bomb
# at pids_max) could fail to start one.
READ_CHUNK = 1_048_576
MAX_LIST_DEPTH = 32
MAX_LIST_ENTRIES = 10_000


EntryType = Literal["file", "dir", "symlink"]


MAX_METADATA = 64  # user xattrs on one file: E2B's metadata, bounded
MAX_METADATA_BYTES = 4096


class EntryRecord(TypedDict):
    """One entry as the file API answers it (`schemas.Entry`'s JSON): SPEC §2.4's fields,
    then the owner and group (ids and names), a symlink's target and the entry's user
    metadata (its `user.*` xattrs, the prefix dropped)."""

    name: str
    path: str
    type: EntryType
    size: int
    mode: str
    modified: str
    uid: int
    gid: int
    owner: str
    group: str
    target: str | None
    metadata: dict[str, str]


# `Files.list` shadows the builtin inside the class body.
EntryRecords = list[EntryRecord]


def _type_of(mode: int) -> EntryType:
    if stat.S_ISLNK(mode):
        return "symlink"
    return "dir" if stat.S_ISDIR(mode) else "file"


@functools.lru_cache(maxsize=256)
def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


@functools.lru_cache(maxsize=256)
def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, OverflowError):
        return str(gid)


def _user_xattrs(where: str) -> dict[str, str]:
    """`where`'s `user.*` xattrs (the prefix dropped); none where the filesystem keeps none."""
    try:
        names = [n for n in os.listxattr(where, follow_symlinks=False) if n.startswith("user.")]
        return {
            n[5:]: os.getxattr(where, n, follow_symlinks=False).decode(errors="replace")
            for n in names[:MAX_METADATA]
        }
    except OSError:
        return {}


def make_entry(
    rel: str, st: os.stat_result, dir_fd: int | None = None, name: str = ""
) -> EntryRecord:
    """The entry of `rel`; with its parent's fd and its name, its symlink target and user
    metadata too (read through the fd, never by a path walked again)."""
    target = None
    metadata: dict[str, str] = {}
    if dir_fd is not None:
        if stat.S_ISLNK(st.st_mode):
            with contextlib.suppress(OSError):
                target = os.readlink(name, dir_fd=dir_fd)
        else:
            where = f"/proc/self/fd/{dir_fd}" + (f"/{name}" if name else "")
            metadata = _user_xattrs(where)
    return {
        "name": posixpath.basename(rel) if rel != "." else "",
        "path": rel,
        "type": _type_of(st.st_mode),
        "size": st.st_size,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "modified": datetime.fromtimestamp(st.st_mtime, UTC).isoformat().replace("+00:00", "Z"),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": _owner(st.st_uid),
        "group": _group(st.st_gid),
        "target": target,
        "metadata": metadata,
    }


def set_metadata(fd: int, rel: str, metadata: dict[str, str]) -> None:
    """`metadata` as `user.<key>` xattrs on the open file `fd`; a filesystem that keeps no
    user xattrs is named in the error rather than the metadata dropped."""
    if len(metadata) > MAX_METADATA or sum(len(k) + len(v) for k, v in metadata.items()) > (
        MAX_METADATA_BYTES
    ):
        raise ServiceError(
            ErrorCode.BAD_REQUEST,
            f"metadata: at most {MAX_METADATA} keys and {MAX_METADATA_BYTES} bytes",
        )
    for key, value in metadata.items():
        try:
            os.setxattr(fd, f"user.{key}", value.encode())
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise ServiceError(
                    ErrorCode.NOT_IMPLEMENTED,
                    f"{rel}: the workspace filesystem does not support user xattrs, "
                    "so file metadata cannot be kept",
                    {"path": rel},
                ) from exc
            raise fs_error(exc, rel) from exc


class Files:
    """The file operations on `places`: the workspace alone for /v1 (SPEC §2.4), the
    workspace and the cell's /tmp for the cell-wide table (§14.2)."""

    def __init__(self, places: Places, max_upload_bytes: int) -> None:
        self.places = places
        self.max_upload_bytes = max_upload_bytes

    def stat(self, path: str) -> EntryRecord:
        ws, rel = self.places.resolve(path)
        shown = self.places.shown(ws, rel)
        if rel == ".":
            return make_entry(shown, os.stat(ws.root_fd), ws.root_fd)
        with ws.parent(rel) as (dir_fd, name):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                return make_entry(shown, st, dir_fd, name)
            except OSError as exc:
                raise fs_error(exc, shown, ws.place) from exc

    def list(self, path: str, depth: int) -> EntryRecords:
        if not 1 <= depth <= MAX_LIST_DEPTH:
            raise ServiceError(
                ErrorCode.BAD_REQUEST, f"depth must be between 1 and {MAX_LIST_DEPTH}"
            )
        ws, rel = self.places.resolve(path)
        entries: EntryRecords = []
        self._list_into(ws, rel, depth, entries)
        return entries

    def _list_into(self, ws: Workspace, rel: str, depth: int, out: EntryRecords) -> None:
        with ws.fd(rel, os.O_RDONLY | os.O_DIRECTORY) as dir_fd:
            try:
                children = sorted(os.scandir(dir_fd), key=lambda e: e.name)
                stats = [(e.name, e.stat(follow_symlinks=False)) for e in children]
            except OSError as exc:
                raise fs_error(exc, rel, ws.place) from exc
            entries: list[tuple[str, os.stat_result, EntryRecord]] = []
            for name, st in stats:
                if len(out) + len(entries) >= MAX_LIST_ENTRIES:
                    raise ServiceError(
                        ErrorCode.BAD_REQUEST,
                        f"more than {MAX_LIST_ENTRIES} entries; list with a smaller depth",
                    )
                child = name if rel == "." else f"{rel}/{name}"
                shown = self.places.shown(ws, child)
                entries.append((child, st, make_entry(shown, st, dir_fd, name)))
        for child, st, entry in entries:
            out.append(entry)
            if depth > 1 and stat.S_ISDIR(st.st_mode):
                try:
                    self._list_into(ws, child, depth - 1, out)
                except ServiceError as exc:
                    # Deep in the cell's root, a directory it may not read (/proc, a 0700
                    # one) is listed but not entered, as `find` goes on past it.
                    if ws.writable or exc.code is not ErrorCode.FORBIDDEN:
                        raise

    def mkdir(self, path: str, parents: bool) -> EntryRecord:
        ws, rel = self.places.resolve(path, change=True)
        if parents:
            ws.makedirs(rel)
        else:
            with ws.parent(rel) as (dir_fd, name):
                try:
                    os.mkdir(name, 0o755, dir_fd=dir_fd)
                except OSError as exc:
                    raise fs_error(exc, rel, ws.place) from exc
        return self.stat(self.places.shown(ws, rel))

    def move(self, src: str, dst: str, overwrite: bool) -> EntryRecord:
        (src_ws, src_rel) = self.places.resolve(src, change=True)
        (dst_ws, dst_rel) = self.places.resolve(dst, change=True)
        if src_ws is not dst_ws:  # two filesystems: a rename cannot cross them
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"{src} cannot be moved to {dst}: a move stays within {src_ws.place}",
                {"path": dst},
            )
        src_ws.rename(src_rel, dst_rel, overwrite)
        return self.stat(self.places.shown(dst_ws, dst_rel))

    def remove(self, path: str, recursive: bool) -> None:
        ws, rel = self.places.resolve(path, change=True)
        with ws.parent(rel) as (dir_fd, name):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=dir_fd)
                elif recursive:
                    # The fd-based rmtree never follows a symlink out of the tree.
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.rmdir(name, dir_fd=dir_fd)
            except OSError as exc:
                raise fs_error(exc, rel, ws.place) from exc

    def open_for_read(self, path: str) -> tuple[int, int]:
        """An fd of a regular file beneath its place and its size: all that an HTTP layer
        able to `os.sendfile` needs (it then closes the fd); `iter_fd` otherwise."""
        ws, rel = self.places.resolve(path)
        fd = ws.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ServiceError(ErrorCode.BAD_REQUEST, f"{rel}: not a regular file", {"path": rel})
        return fd, st.st_size

    @staticmethod
    async def iter_fd(fd: int) -> AsyncIterator[bytes]:
        """The file's bytes, then the fd closed."""
        try:
            while chunk := os.read(fd, READ_CHUNK):
                yield chunk
        finally:
            os.close(fd)

    async def write(
        self,
        path: str,
        chunks: AsyncIterable[bytes],
        declared_size: int | None,
        before_commit: Callable[[], None] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> EntryRecord:
        """Streams into a temp file next to the target, then renames it into place.

        `before_commit` runs once the body is complete (the request-token body check), so a
        rejected upload never replaces the target.
        """
        ws, rel = self.places.resolve(path, change=True)
        if declared_size is not None and declared_size > self.max_upload_bytes:
            raise self._too_large(rel)
        head = posixpath.dirname(rel)
        if head:
            ws.makedirs(head)
        _refuse_outward_link(ws, rel)
        with ws.parent(rel) as (dir_fd, name):
            tmp = f".{name}.sandcell-upload-{secrets.token_hex(6)}"
            try:
                fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o644,
                    dir_fd=dir_fd,
                )
            except OSError as exc:
                raise fs_error(exc, rel, ws.place) from exc
            try:
                await self._copy_bounded(fd, chunks, rel)
                if metadata:
                    set_metadata(fd, rel, metadata)
                if before_commit is not None:
                    before_commit()
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                _unlink_quietly(tmp, dir_fd)
                raise
            finally:
                os.close(fd)
        return self.stat(self.places.shown(ws, rel))

    async def _copy_bounded(self, fd: int, chunks: AsyncIterable[bytes], rel: str) -> None:
        written = 0
        async for chunk in chunks:
            written += len(chunk)
            if written > self.max_upload_bytes:
                raise self._too_large(rel)
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as exc:
                raise fs_error(exc, rel) from exc

    def _too_large(self, rel: str) -> ServiceError:
        return ServiceError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{rel}: upload exceeds the disk quota of {self.max_upload_bytes} bytes",
            {"path": rel, "limit_bytes": self.max_upload_bytes},
        )


def _refuse_outward_link(ws: Workspace, rel: str) -> None:
    """The rename would replace a symlink, not follow it; still, one pointing out is a 403."""
    try:
        os.close(ws.open(rel, os.O_PATH))
    except ServiceError as exc:
        if exc.code is not ErrorCode.FILE_NOT_FOUND:
            raise


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)
