"""Files in a sandbox's workspace (SPEC §2.4): `sbx.files.*`, written once.

Paths are relative to the workspace (an absolute path must lie inside it). `upload` and
`download` stream between a local file and the sandbox in chunks, never holding the file whole.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import stat as stat_module
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sandcell.client.binding import AsyncBound, SyncBound, operation
from sandcell.client.errors import (
    ConnectionFailedError,
    FileNotFoundInSandboxError,
)
from sandcell.client.lifecycle import sandbox_path
from sandcell.client.models import EntryInfo, list_in
from sandcell.client.protocol import (
    Blocking,
    FileUpload,
    Invoke,
    Op,
    ProgressFn,
    Read,
    Request,
    call,
    call_json,
)

if TYPE_CHECKING:
    from sandcell.client.lifecycle import SandboxBase

PathArg = str | os.PathLike[str]
WRITE_BATCH = 1_048_576


def _flag(value: bool) -> str:
    return "true" if value else "false"


class FilesBase:
    """`sbx.files`: read, write, list and move files in the sandbox's workspace."""

    def __init__(self, sandbox: SandboxBase) -> None:
        self._sandbox = sandbox
        self._transport = sandbox._transport

    def _path(self, rest: str = "") -> str:
        return sandbox_path(self._sandbox.id, "files" + (f"/{rest}" if rest else ""))

    def _json(self, request: Request) -> Op[Any]:
        return call_json(request, self._transport.config.retry)

    def _entry(self, request: Request) -> Op[EntryInfo]:
        return EntryInfo.from_dict((yield from self._json(request)))

    def _read(self, path: PathArg) -> Op[bytes]:
        request = Request("GET", self._path(), params={"path": os.fspath(path)})
        reply = yield from call(request, self._transport.config.retry)
        return reply.body

    def _stat(self, path: PathArg) -> Op[EntryInfo]:
        return self._entry(Request("GET", self._path("stat"), params={"path": os.fspath(path)}))

    @operation
    def read(self, path: PathArg) -> Op[bytes]:
        """The file's bytes (use `download` for large files)."""
        return (yield from self._read(path))

    @operation
    def read_text(self, path: PathArg, encoding: str = "utf-8", errors: str = "strict") -> Op[str]:
        """The file decoded as text."""
        data = yield from self._read(path)
        return data.decode(encoding, errors)

    @operation
    def write(self, path: PathArg, data: bytes | str) -> Op[EntryInfo]:
        """Create or replace the file (parents are created); text is written as UTF-8."""
        content = data.encode() if isinstance(data, str) else bytes(data)
        request = Request("PUT", self._path(), params={"path": os.fspath(path)}, content=content)
        return (yield from self._entry(request))

    @operation
    def list(self, path: PathArg = ".", depth: int = 1) -> Op[list[EntryInfo]]:
        """The entries under a directory, `depth` levels deep (1: its children only)."""
        params = {"path": os.fspath(path), "depth": str(depth)}
        data = yield from self._json(Request("GET", self._path("list"), params=params))
        return [EntryInfo.from_dict(x) for x in list_in(data, "entries")]

    @operation
    def stat(self, path: PathArg) -> Op[EntryInfo]:
        """Describe one path (a symlink is described, not followed)."""
        return (yield from self._stat(path))

    @operation
    def exists(self, path: PathArg) -> Op[bool]:
        try:
            yield from self._stat(path)
        except FileNotFoundInSandboxError:
            return False
        return True

    @operation
    def mkdir(self, path: PathArg, parents: bool = True) -> Op[EntryInfo]:
        """Create a directory (and its parents unless `parents=False`; existing is fine then)."""
        body = {"path": os.fspath(path), "parents": parents}
        # mkdir -p is idempotent; a plain mkdir that may have run is not repeated (409).
        request = Request("POST", self._path("mkdir"), json=body, idempotent=parents)
        return (yield from self._entry(request))

    @operation
    def move(self, src: PathArg, dst: PathArg, overwrite: bool = False) -> Op[EntryInfo]:
        """Move or rename; ConflictError if `dst` exists and not `overwrite`."""
        body = {"from": os.fspath(src), "to": os.fspath(dst), "overwrite": overwrite}
        request = Request("POST", self._path("move"), json=body, idempotent=False)
        return (yield from self._entry(request))

    @operation
    def remove(self, path: PathArg, recursive: bool = False) -> Op[None]:
        """Delete a file, or a directory (empty unless `recursive=True`)."""
        params = {"path": os.fspath(path), "recursive": _flag(recursive)}
        # Not repeated once sent: a second attempt would report FILE_NOT_FOUND for a success.
        request = Request("DELETE", self._path(), params=params, idempotent=False)
        yield from call(request, self._transport.config.retry)

    @operation
    def upload(
        self, local_path: PathArg, remote_path: PathArg, progress: ProgressFn | None = None
    ) -> Op[EntryInfo]:
        """Stream a local file into the sandbox, chunk by chunk.

        `progress(bytes_done, total)` is called as chunks are sent. Past the template's disk
        quota the upload fails with PayloadTooLargeError and the target is left untouched.
        """
        size = yield Blocking(_regular_file_size, (local_path,))
        upload = FileUpload(Path(local_path), size, progress)
        request = Request(
            "PUT",
            self._path(),
            params={"path": os.fspath(remote_path)},
            content=upload,
            headers={"content-length": str(size)},
        )
        return (yield from self._entry(request))

    @operation
    def download(
        self, remote_path: PathArg, local_path: PathArg, progress: ProgressFn | None = None
    ) -> Op[Path]:
        """Stream a file out of the sandbox to `local_path` (into it, if it is a directory).

        The data lands in a temporary file renamed into place once complete, so a failed
        download leaves no partial file. `progress(bytes_done, total)` is called as data is
        written, about every MiB (`total` is None if the server did not say). Returns the
        local path written.
        """
        request = Request("GET", self._path(), params={"path": os.fspath(remote_path)}, stream=True)
        reply = yield from call(request, self._transport.config.retry)
        length = reply.headers.get("content-length")
        total = int(length) if length and length.isdigit() else None
        target: Path = yield Blocking(_download_target, (local_path, os.fspath(remote_path)))
        part = target.with_name(f".{target.name}.sandcell-{secrets.token_hex(4)}.part")
        fh: IO[bytes] = yield Blocking(open, (part, "wb"))
        try:
            done = 0
            while batch := (yield from _read_batch(reply.stream)):
                yield Blocking(fh.writelines, (batch,))
                done += sum(map(len, batch))
                if progress is not None:
                    yield Invoke(progress, (done, total))
            yield Blocking(fh.close, ())
            _check_complete(os.fspath(remote_path), done, total)
            yield Blocking(os.replace, (part, target))
        except GeneratorExit:
            _discard(fh, part)
            raise
        except BaseException:
            yield Blocking(_discard, (fh, part))
            raise
        return target


def _read_batch(stream: Any) -> Op[list[bytes]]:
    """The next chunks of a download, about WRITE_BATCH bytes of them ([] at its end): one
    local write (for AsyncSandbox, one worker thread) per batch, not per network read."""
    batch: list[bytes] = []
    size = 0
    while size < WRITE_BATCH and (chunk := (yield Read(stream))):
        batch.append(chunk)
        size += len(chunk)
    return batch


def _regular_file_size(path: PathArg) -> int:
    st = os.stat(path)
    if not stat_module.S_ISREG(st.st_mode):
        raise IsADirectoryError(f"{os.fspath(path)}: not a regular file")
    return st.st_size


def _download_target(local_path: PathArg, remote_path: str) -> Path:
    target = Path(local_path)
    if target.is_dir():
        target = target / posixpath.basename(remote_path.rstrip("/"))
    return target


def _check_complete(remote_path: str, done: int, total: int | None) -> None:
    if total is not None and done != total:
        raise ConnectionFailedError(
            f"the download of {remote_path} stopped at {done} of {total} bytes",
            request_sent=True,
        )


def _discard(fh: IO[bytes], part: Path) -> None:
    with contextlib.suppress(OSError):
        fh.close()
    with contextlib.suppress(OSError):
        part.unlink()


class Files(SyncBound, FilesBase):
    __doc__ = FilesBase.__doc__


class AsyncFiles(AsyncBound, FilesBase):
    __doc__ = FilesBase.__doc__
