"""The `image` table of a template (SPEC §12) and the digest that names its build.

The digest covers everything the build reads: the spec itself, the bytes of each file it
copies in, and the bytes of an OCI archive base. An unchanged spec with unchanged inputs has
the same digest, so building it again is a no-op. `max_unpacked_mb` is left out: a bound
decides whether a build may finish, not what it makes, so raising it after a refused build
retries the same image, and adding the setting left every built image's digest as it was.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Bumped when the build's output for a given spec changes (a new mount anchor, a new layout).
BUILD_FORMAT = 1
_SUITE = re.compile(r"^[a-z][a-z0-9-]{1,30}$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_:=<>!~,\[\]-]*$")
BaseKind = Literal["host", "debian", "oci-archive"]
MIB = 1 << 20
# An OCI archive may unpack to at most this much (a few GiB: large language-runtime images
# fit, a gzip bomb of a few MiB does not fill the host's disk).
DEFAULT_MAX_UNPACKED_MB = 4096
NOT_IN_DIGEST = frozenset({"oci", "max_unpacked_mb"})


class ImageSpec(BaseModel):
    """`context_dir` is the config file's directory: relative paths are read from there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: str = "host"
    apt: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()
    run: tuple[str, ...] = ()
    files: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    oci: str | None = None  # Kubernetes: the pod's image
    # The most an `oci-archive:` base may write while unpacking (data, and 4 KiB per entry).
    max_unpacked_mb: int = Field(DEFAULT_MAX_UNPACKED_MB, ge=1, le=1_048_576)
    context_dir: str = Field(".", exclude=True)

    @field_validator("base")
    @classmethod
    def _known_base(cls, base: str) -> str:
        kind, _, rest = base.partition(":")
        if base == "host" or (kind == "debian" and _SUITE.match(rest)):
            return base
        if kind == "oci-archive" and rest:
            return base
        raise ValueError(
            f"unknown base {base!r}: use 'host', 'debian:<suite>' or 'oci-archive:<path>'"
        )

    @field_validator("apt", "pip")
    @classmethod
    def _package_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in names if not _PACKAGE.match(n)]
        if bad:
            raise ValueError(f"not package names: {bad}")
        return names

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, workdir: str | None) -> str | None:
        if workdir is not None:
            _image_path(workdir)
        return workdir

    @model_validator(mode="after")
    def _coherent(self) -> ImageSpec:
        if self.base == "host" and (self.apt or self.pip or self.run or self.files):
            raise ValueError("apt, pip, run and files need a base image, not 'host'")
        if self.apt and self.kind != "debian":
            raise ValueError("apt needs a 'debian:<suite>' base")
        if "max_unpacked_mb" in self.model_fields_set and self.kind != "oci-archive":
            raise ValueError("max_unpacked_mb bounds an 'oci-archive:' base; this one has none")
        for dest, source in self.files.items():
            _image_path(dest)
            self.source_path(source)
        return self

    @property
    def kind(self) -> BaseKind:
        return "host" if self.base == "host" else self.base.partition(":")[0]  # type: ignore[return-value]

    @property
    def suite(self) -> str:
        return self.base.partition(":")[2]

    @property
    def archive(self) -> Path:
        return Path(self.context_dir, self.base.partition(":")[2])

    @property
    def built(self) -> bool:
        """Whether cells of this spec need a built root (host cells use the host's dirs)."""
        return self.kind != "host"

    def source_path(self, source: str) -> Path:
        """A file to copy in; one outside the config's directory is refused (a config
        must not read the server's keys into an image)."""
        context = Path(self.context_dir).resolve()
        path = (context / source).resolve()
        if not path.is_relative_to(context):
            raise ValueError(f"files: {source!r} is outside the config directory")
        return path

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def digest(spec: ImageSpec) -> str:
    """sha256 of the spec and the bytes of its inputs; missing inputs hash as missing (the
    build then fails with the path, and a later fix changes the digest)."""
    inputs: dict[str, Any] = {
        "format": BUILD_FORMAT,
        "spec": spec.model_dump(mode="json", exclude=set(NOT_IN_DIGEST)),
        "files": {dest: _file_digest(spec.source_path(src)) for dest, src in spec.files.items()},
    }
    if spec.kind == "oci-archive":
        inputs["archive"] = _file_digest(spec.archive.resolve())
    del inputs["spec"]["files"]
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


_cache: dict[tuple[str, int, int, int], str] = {}
_cache_lock = threading.Lock()


def _file_digest(path: Path) -> str | None:
    """Cached by (path, inode, size, mtime): an archive of hundreds of MB is read once."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    with _cache_lock:
        _cache[key] = h.hexdigest()
    return _cache[key]


def _image_path(path: str) -> str:
    """An absolute, normalised path inside the image."""
    if not path.startswith("/") or posixpath.normpath(path) != path or "\0" in path:
        raise ValueError(f"{path!r} must be an absolute, normalised path inside the image")
    return path
