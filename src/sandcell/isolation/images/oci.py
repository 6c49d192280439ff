"""Unpacking an OCI image archive into a root directory, refusing anything that would write
outside it (SPEC §12).

The archive is a tar of an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/...`).
Its JSON documents are read through small typed models; its layers are tar streams (gzip or
plain) applied in order, honouring whiteouts (`.wh.NAME` deletes NAME from the layers below,
`.wh..wh..opq` empties its directory of them). Every blob is checked against its digest.

Python 3.11.2's tarfile has no extraction filters, so each member is placed by hand with the
rules they would apply: no absolute names, no `..`, no path through a symlink (an absolute
symlink in a layer stays a symlink inside the image; it is never followed while unpacking),
hard links only to files already inside the root, no device nodes, no set-id bits,
ownership dropped (the build is rootless). This runs inside the build cell, whose only
writable mount is the root being made: the rules and the cell are two walls, not one.

Whiteouts are names too: `.wh...` would delete the root's parent and `.wh.` or `.wh..` the
directory holding them, so a whiteout must name an entry of its directory (not empty, `.` or
`..`), reached without a symlink. Directory modes are set at the end through descriptors
opened without following links, so a later layer that turns a directory into a symlink
cannot redirect them. Any other failure to place an entry is an error naming it, never a
traceback.

The unpacked size is bounded (`image.max_unpacked_mb`): a gzip layer of 1 MiB can inflate
to 1 GiB (zeros, a sparse file's holes, thousands of hard links), and the host's disk is
what fills. Every byte a layer writes is counted, a file rewritten by a later layer twice
(as Docker counts its layers), holes as the zeros they become, plus ENTRY_BYTES for each
entry placed; a hard link adds only that (its data is already counted). A file whose header
alone passes the bound is refused before a byte of it is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import shutil
import stat
import sys
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandcell.isolation.images.spec import DEFAULT_MAX_UNPACKED_MB, MIB

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
# aufs's own bookkeeping (`.wh..wh.plnk/`, `.wh..wh.aufs`) at the top of old Docker layers:
# not part of the image, skipped as Docker skips it.
AUFS_META = ".wh..wh."
# What an entry costs beyond its data: the block the published image reserves for each
# (store._make_image), so a layer of a million empty files or hard links is bounded too.
ENTRY_BYTES = 4096
NAME_SHOWN = 200  # characters of an archive's name quoted in an error
CHUNK = 1 << 20
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
}
M = TypeVar("M", bound=BaseModel)
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


class OciError(Exception):
    """The archive is missing, malformed, or a layer tries to leave the root."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Descriptor(_Model):
    media_type: str = Field(alias="mediaType")
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size: int = Field(ge=0)


class Index(_Model):
    schema_version: int = Field(alias="schemaVersion")
    manifests: list[Descriptor] = Field(min_length=1)


class Manifest(_Model):
    config: Descriptor
    layers: list[Descriptor]


class RuntimeConfig(_Model):
    env: list[str] = Field(default_factory=list, alias="Env")
    working_dir: str = Field("", alias="WorkingDir")


class ImageConfig(_Model):
    config: RuntimeConfig = Field(default_factory=RuntimeConfig)


@dataclass(frozen=True)
class Unpacked:
    """What the image's config says cells should start with."""

    env: dict[str, str]
    workdir: str


def unpack(archive: Path, root: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_MB * MIB) -> Unpacked:
    """Applies the archive's first manifest's layers to the empty directory `root`, writing
    at most `max_bytes` (data and ENTRY_BYTES per entry) before refusing the archive."""
    try:
        tar = tarfile.open(archive, "r:")  # noqa: SIM115 - closed below
    except (OSError, tarfile.TarError) as exc:
        raise OciError(f"cannot read the OCI archive {archive}: {exc}") from None
    with tar:
        layout = _Layout(tar)
        manifest = layout.manifest()
        config = layout.document(manifest.config, ImageConfig)
        modes: dict[str, int] = {}
        budget = _Budget(max_bytes)
        for number, layer in enumerate(manifest.layers, 1):
            if layer.media_type not in LAYER_TYPES:
                raise OciError(f"layer {number}: unsupported media type {layer.media_type}")
            with layout.blob(layer) as stream:
                _apply_layer(stream, _Layer(root, number, budget), modes)
        _set_modes(root, modes)
    env = dict(e.partition("=")[::2] for e in config.config.env if "=" in e)
    return Unpacked(env, config.config.working_dir)


class _Layout:
    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar

    def _member(self, name: str) -> IO[bytes]:
        try:
            f = self.tar.extractfile(name)
        except KeyError:
            f = None
        if f is None:
            raise OciError(f"malformed OCI layout: no regular file {name!r} in the archive")
        return f

    def manifest(self) -> Manifest:
        index = _parse(self._member("index.json").read(), Index, "index.json")
        first = index.manifests[0]
        if first.media_type == INDEX_TYPE:
            raise OciError("nested image indexes are not supported; save a single platform")
        return self.document(first, Manifest)

    def document(self, descriptor: Descriptor, model: type[M]) -> M:
        with self.blob(descriptor) as f:
            data = f.read()
        return _parse(data, model, descriptor.digest)

    def blob(self, descriptor: Descriptor) -> _Verified:
        name = "blobs/sha256/" + descriptor.digest.removeprefix("sha256:")
        return _Verified(self._member(name), descriptor)


class _Verified:
    """A blob read once, hashed on the way; a wrong digest or size fails at the end."""

    def __init__(self, f: IO[bytes], descriptor: Descriptor) -> None:
        self._f, self._want, self._hash, self._size = f, descriptor, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._hash.update(data)
        self._size += len(data)
        return data

    def __enter__(self) -> _Verified:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:
            return
        while self.read(1 << 20):
            pass
        got = "sha256:" + self._hash.hexdigest()
        if got != self._want.digest or self._size != self._want.size:
            raise OciError(f"blob {self._want.digest} does not match its digest or size")


def _parse(data: bytes, model: type[M], what: str) -> M:
    try:
        return model.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise OciError(f"malformed OCI layout: {what}: {exc}") from None


def _shown(name: str) -> str:
    """An archive's name as an error quotes it: escaped, and cut short (the log is a tenant-
    sized line otherwise)."""
    return repr(name[:NAME_SHOWN]) + ("..." if len(name) > NAME_SHOWN else "")


@dataclass
class _Budget:
    """Bytes written so far against the image's bound, shared by every layer."""

    limit: int
    used: int = 0

    def charge(self, amount: int, name: str, number: int) -> None:
        if self.used + amount > self.limit:
            raise OciError(
                f"layer {number}: {_shown(name)} takes the unpacked image past its bound of "
                f"{self.limit // MIB} MiB (image.max_unpacked_mb); refused"
            )
        self.used += amount


@dataclass
class _Layer:
    """One layer being applied: its own entries (and their parents), which its whiteouts
    and opaque markers leave alone, as the OCI spec says they apply to lower layers only."""

    root: Path
    number: int
    budget: _Budget
    created: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)

    def record(self, name: str) -> None:
        self.created.add(name)
        while (name := posixpath.dirname(name)) and name not in self.parents:
            self.parents.add(name)

    def ours(self, name: str) -> bool:
        return name in self.created or name in self.parents


def _apply_layer(stream: _Verified, layer: _Layer, modes: dict[str, int]) -> None:
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:  # type: ignore[call-overload]
            for member in tar:
                try:
                    _apply_member(tar, member, layer, modes)
                except OSError as exc:  # a name too long, a full disk...: named, no traceback
                    reason = exc.strerror or str(exc)
                    raise OciError(
                        f"layer {layer.number}: {_shown(member.name)} cannot be placed: {reason}"
                    ) from None
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise OciError(f"layer {layer.number} is not a valid tar stream: {exc}") from None


def _apply_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, layer: _Layer, modes: dict[str, int]
) -> None:
    name = _clean(member.name, layer.number)
    if not name:
        return
    parent, leaf = posixpath.split(name)
    if leaf == OPAQUE:
        _opaque(layer, parent, member.name)
        return
    if name.startswith(AUFS_META):
        return
    _no_whiteout_above(parent, member.name, layer.number)
    if leaf.startswith(WHITEOUT):
        _whiteout(layer, parent, leaf, member.name)
        return
    parent_dir = _directory(layer.root, parent, layer.number)
    path = parent_dir / leaf
    if member.isdir():
        layer.budget.charge(ENTRY_BYTES, member.name, layer.number)
        layer.record(name)
        if not (path.is_dir() and not path.is_symlink()):
            _remove(path)
            path.mkdir(mode=0o755)
        modes[name] = _mode(member) | stat.S_IWUSR | stat.S_IXUSR
        return
    if not (member.isreg() or member.issym() or member.islnk() or member.isfifo()):
        return  # device nodes are dropped: cells get a minimal /dev of their own (SPEC §3)
    size = member.size if member.isreg() else 0
    layer.budget.charge(ENTRY_BYTES + size, member.name, layer.number)
    layer.record(name)
    _remove(path)
    if member.isreg():
        _write(tar, member, path)
    elif member.issym():
        os.symlink(member.linkname, path)
    elif member.islnk():
        os.link(_link_target(layer, member), path, follow_symlinks=False)
    else:
        os.mkfifo(path, _mode(member))


def _clean(name: str, number: int) -> str:
    """The member's path relative to the root; absolute names and `..` are refused."""
    if name.startswith("/") or "\0" in name:
        raise OciError(f"layer {number}: absolute path {_shown(name)} refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OciError(f"layer {number}: path traversal {_shown(name)} refused")
    return "/".join(parts)


def _no_whiteout_above(parent: str, name: str, number: int) -> None:
    """A whiteout is a marker file, never a directory other entries live in."""
    if any(part.startswith(WHITEOUT) for part in parent.split("/")):
        raise OciError(f"layer {number}: {_shown(name)} is inside a whiteout; refused")


def _whiteout(layer: _Layer, parent: str, leaf: str, name: str) -> None:
    """`.wh.NAME` deletes NAME of its directory from the layers below. NAME must be an entry:
    `.wh...` would name the directory's parent (the root's, at the top: the staging dir),
    `.wh..` and `.wh.` the directory itself; `.wh..wh.*` other than the opaque marker is
    aufs metadata, which has no place below the top."""
    target = leaf.removeprefix(WHITEOUT)
    if target in ("", ".", "..") or leaf.startswith(AUFS_META):
        raise OciError(
            f"layer {layer.number}: whiteout {_shown(name)} does not name an entry of its "
            "directory; refused"
        )
    directory = _existing_directory(layer.root, parent, name, layer.number)
    hidden = posixpath.join(parent, target)
    if directory is not None and not layer.ours(hidden):
        _remove(directory / target)


def _opaque(layer: _Layer, parent: str, name: str) -> None:
    """`DIR/.wh..wh..opq` hides what the layers below hold in DIR, recursively, and none of
    this layer's own entries, whether they come before the marker or after it."""
    _no_whiteout_above(parent, name, layer.number)
    directory = _existing_directory(layer.root, parent, name, layer.number)
    if directory is not None:
        _empty_below(directory, parent, layer)


def _empty_below(directory: Path, relative: str, layer: _Layer) -> None:
    for child in list(directory.iterdir()):
        name = posixpath.join(relative, child.name)
        if not layer.ours(name):
            _remove(child)
        elif child.is_dir() and not child.is_symlink():
            _empty_below(child, name, layer)


def _directory(root: Path, relative: str, number: int) -> Path:
    """The existing or new directory `relative` under root, never through a symlink."""
    current = root
    for part in relative.split("/") if relative else ():
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            current.mkdir(mode=0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise OciError(f"layer {number}: {_shown(relative)} goes through a symlink; refused")
        if not stat.S_ISDIR(st.st_mode):
            raise OciError(f"layer {number}: {_shown(relative)} is not a directory")
    return current


def _existing_directory(root: Path, relative: str, name: str, number: int) -> Path | None:
    """The directory `relative` under root if it exists (None: nothing there to hide or link
    to), never through a symlink. Whiteouts and link targets make no directories."""
    current = root
    for part in relative.split("/") if relative else ():
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise OciError(f"layer {number}: {_shown(name)} goes through a symlink; refused")
        if not stat.S_ISDIR(st.st_mode):
            raise OciError(f"layer {number}: {_shown(name)}: {relative!r} is not a directory")
    return current


def _link_target(layer: _Layer, member: tarfile.TarInfo) -> Path:
    """A hard link's target: a regular file already inside the root, reached without a
    symlink (a link to a host file would be the host file)."""
    linkname = _clean(member.linkname, layer.number)
    parent, leaf = posixpath.split(linkname)
    directory = _existing_directory(layer.root, parent, member.name, layer.number)
    target = None if directory is None or not leaf else directory / leaf
    try:
        regular = target is not None and stat.S_ISREG(target.lstat().st_mode)
    except FileNotFoundError:
        regular = False
    if target is None or not regular:
        raise OciError(
            f"layer {layer.number}: hard link {_shown(member.name)} to a missing file "
            f"{_shown(member.linkname)}"
        )
    return target


def _remove(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    """The file's bytes (a sparse member's holes as zeros), at most the size charged for it."""
    source = tar.extractfile(member)
    assert source is not None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with os.fdopen(os.open(path, flags, 0o600), "wb") as out:
        written = 0
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > member.size:  # tarfile reads exactly the size; checked, not trusted
                raise OciError(f"{_shown(member.name)} holds more than its header says")
            out.write(chunk)
        os.fchmod(out.fileno(), _mode(member))


def _set_modes(root: Path, modes: dict[str, int]) -> None:
    """Directories get their modes last (a read-only one is written into first), deepest
    first, each through a descriptor opened link by link without following any: a directory
    that a later layer replaced with a symlink keeps the symlink, and nothing outside the
    root changes mode."""
    for relative in sorted(modes, key=lambda r: r.count("/"), reverse=True):
        fd = _open_directory(root, relative)
        if fd is not None:
            try:
                os.fchmod(fd, modes[relative])
            finally:
                os.close(fd)


def _open_directory(root: Path, relative: str) -> int | None:
    """A descriptor of the real directory root/relative; None when it is no longer one."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(root, flags)
    for part in relative.split("/"):
        try:
            child = os.open(part, flags, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise
        os.close(fd)
        fd = child
    return fd


def _mode(member: tarfile.TarInfo) -> int:
    return member.mode & 0o777  # no set-id or sticky bits from a layer


def _main(argv: list[str]) -> int:
    """`python -m sandcell.isolation.images.oci ARCHIVE ROOT CONFIG MAX_BYTES`: run inside
    the build cell; writes the image's config (env, workdir) to CONFIG as JSON. A refusal is
    one `error:` line, the build's message (no traceback)."""
    archive, root, config = (Path(a) for a in argv[:3])
    try:
        result = unpack(archive, root, int(argv[3]))
    except (OciError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    config.write_text(json.dumps({"env": result.env, "workdir": result.workdir}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
