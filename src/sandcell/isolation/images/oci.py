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
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import stat
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
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


def unpack(archive: Path, root: Path) -> Unpacked:
    """Applies the archive's first manifest's layers to the empty directory `root`."""
    try:
        tar = tarfile.open(archive, "r:")  # noqa: SIM115 - closed below
    except (OSError, tarfile.TarError) as exc:
        raise OciError(f"cannot read the OCI archive {archive}: {exc}") from None
    with tar:
        layout = _Layout(tar)
        manifest = layout.manifest()
        config = layout.document(manifest.config, ImageConfig)
        modes: dict[str, int] = {}
        for number, layer in enumerate(manifest.layers, 1):
            if layer.media_type not in LAYER_TYPES:
                raise OciError(f"layer {number}: unsupported media type {layer.media_type}")
            with layout.blob(layer) as stream:
                _apply_layer(stream, root, modes, number)
        for path in sorted(modes, key=len, reverse=True):  # directories last, deepest first
            os.chmod(path, modes[path])
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


@dataclass
class _Layer:
    root: Path
    number: int
    created: set[str] = field(default_factory=set)


def _apply_layer(stream: _Verified, root: Path, modes: dict[str, int], number: int) -> None:
    layer = _Layer(root, number)
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:  # type: ignore[call-overload]
            for member in tar:
                _apply_member(tar, member, layer, modes)
    except tarfile.TarError as exc:
        raise OciError(f"layer {number} is not a valid tar stream: {exc}") from None


def _apply_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, layer: _Layer, modes: dict[str, int]
) -> None:
    name = _clean(member.name, layer.number)
    if not name:
        return
    parent, leaf = posixpath.split(name)
    parent_dir = _directory(layer.root, parent, layer.number)
    if leaf == OPAQUE:
        _empty_below(parent_dir, parent, layer)
        return
    if leaf.startswith(WHITEOUT):
        _remove(parent_dir / leaf.removeprefix(WHITEOUT))
        return
    path = parent_dir / leaf
    layer.created.add(name)
    if member.isdir():
        if not (path.is_dir() and not path.is_symlink()):
            _remove(path)
            path.mkdir(mode=0o755)
        modes[str(path)] = _mode(member) | stat.S_IWUSR | stat.S_IXUSR
        return
    _remove(path)
    if member.isreg():
        _write(tar, member, path)
    elif member.issym():
        os.symlink(member.linkname, path)
    elif member.islnk():
        target = layer.root / _clean(member.linkname, layer.number)
        _directory(layer.root, posixpath.dirname(_clean(member.linkname, layer.number)), 0)
        if not target.is_file() or target.is_symlink():
            raise OciError(f"layer {layer.number}: hard link {name} to a missing file")
        os.link(target, path, follow_symlinks=False)
    elif member.isfifo():
        os.mkfifo(path, _mode(member))
    # Device nodes are dropped: cells get a minimal /dev of their own (SPEC §3).


def _clean(name: str, number: int) -> str:
    """The member's path relative to the root; absolute names and `..` are refused."""
    if name.startswith("/") or "\0" in name:
        raise OciError(f"layer {number}: absolute path {name!r} refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OciError(f"layer {number}: path traversal {name!r} refused")
    return "/".join(parts)


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
            raise OciError(f"layer {number}: {relative!r} goes through a symlink; refused")
        if not stat.S_ISDIR(st.st_mode):
            raise OciError(f"layer {number}: {relative!r} is not a directory")
    return current


def _empty_below(directory: Path, relative: str, layer: _Layer) -> None:
    """An opaque whiteout hides the lower layers' entries, not this layer's own."""
    prefix = f"{relative}/" if relative else ""
    for child in list(directory.iterdir()):
        if f"{prefix}{child.name}" not in layer.created:
            _remove(child)


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
    source = tar.extractfile(member)
    assert source is not None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with os.fdopen(os.open(path, flags, 0o600), "wb") as out:
        shutil.copyfileobj(source, out)
    os.chmod(path, _mode(member))


def _mode(member: tarfile.TarInfo) -> int:
    return member.mode & 0o777  # no set-id or sticky bits from a layer


def _main(argv: list[str]) -> int:
    """`python -m sandcell.isolation.images.oci ARCHIVE ROOT CONFIG`: run inside the build
    cell; writes the image's config (env, workdir) to CONFIG as JSON."""
    archive, root, config = (Path(a) for a in argv)
    try:
        result = unpack(archive, root)
    except OciError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    config.write_text(json.dumps({"env": result.env, "workdir": result.workdir}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
