"""Built images under the data dir, content-addressed and read-only (SPEC §12).

    images/<digest>/rootfs.img    the root as an ext4 image, owned by the host's root
    images/<digest>/root          where that image is loop-mounted, read-only, for cells
    images/<digest>/image.json    digest, size, build time, the image's env and workdir
    images/tmp/                   builds under way; renamed into place when complete
    images/failed/<digest>.json   why the last build of that digest failed
    images/locks/<digest>.lock    held (flock) by the one process building that digest

A build is published by one rename, so a reader sees either no image or a whole one; a
crashed build leaves only a directory in tmp/, removed by the next build.

An image is a filesystem of its own, mounted read-only: nothing (not the host's root by
mistake) writes to it, and a cell's /proc/self/mountinfo shows a loop device and "/" for it,
never a path of the data directory. Without root (development), the built directory
`images/<digest>/rootfs` is used as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandcell.isolation.disk import mount_image, release_workspace, run_checked

State = Literal["absent", "building", "ready", "failed"]
# Files the cell binds its own copies over: they must be plain files in the image.
ETC_ANCHORS = ("passwd", "group", "hosts", "hostname")
IMAGE_FILE, MOUNTED, TREE = "rootfs.img", "root", "rootfs"
MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "root_owner=0:0")


@dataclass(frozen=True)
class ImageMeta:
    digest: str
    size_bytes: int
    built_at: float
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""


@dataclass(frozen=True)
class ImageState:
    state: State
    digest: str | None = None
    size_bytes: int | None = None
    built_at: float | None = None
    error: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        view = asdict(self)
        if self.error is None:
            del view["error"]
        return view


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        for sub in ("tmp", "failed", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root.chmod(0o711)  # cells' uids traverse to the roots, never list them

    def rootfs(self, digest: str) -> Path:
        """The image's root as cells bind it: mounted on first use (a path that does not
        exist for an image that does not)."""
        image = self.root / digest
        if not (image / IMAGE_FILE).exists():
            return image / TREE
        mounted = image / MOUNTED
        if not os.path.ismount(mounted):
            with self._lock_file(f"{digest}.mount") as fd:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not os.path.ismount(mounted):
                    mount_image(image / IMAGE_FILE, mounted, read_only=True)
        return mounted

    def unmount_all(self) -> None:
        """Unmounts every image (a server stopping; cells still running keep their own
        binds of it, and the loop device is freed when the last one goes)."""
        for image in self.root.iterdir():
            _unmount(image / MOUNTED)

    def meta(self, digest: str) -> ImageMeta | None:
        try:
            return ImageMeta(**json.loads((self.root / digest / "image.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def state(self, digest: str) -> ImageState:
        if (meta := self.meta(digest)) is not None:
            return ImageState("ready", digest, meta.size_bytes, meta.built_at)
        if self.building(digest):
            return ImageState("building", digest)
        with contextlib.suppress(OSError, ValueError):
            error = json.loads((self.root / "failed" / f"{digest}.json").read_text())
            return ImageState("failed", digest, error=error)
        return ImageState("absent", digest)

    def building(self, digest: str) -> bool:
        with self._lock_file(f"{digest}.lock") as fd:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False

    @contextlib.contextmanager
    def building_lock(self, digest: str) -> Iterator[bool]:
        """Exclusive across processes; yields False (not taken) when another process holds
        it: concurrent builds of one digest are one build."""
        with self._lock_file(f"{digest}.lock") as fd:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True

    @contextlib.contextmanager
    def _lock_file(self, name: str) -> Iterator[int]:
        fd = os.open(self.root / "locks" / name, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            yield fd
        finally:
            os.close(fd)

    def staging(self, digest: str) -> Path:
        """A fresh directory for one build; leftovers of crashed builds of it are removed."""
        for old in (self.root / "tmp").glob(f"{digest}.*"):
            _force_remove(old)
        path = self.root / "tmp" / f"{digest}.{secrets.token_hex(4)}"
        (path / "rootfs").mkdir(parents=True, mode=0o755)
        return path

    def publish(self, staging: Path, digest: str, env: dict[str, str], workdir: str) -> ImageMeta:
        rootfs = staging / TREE
        _anchor(rootfs)
        size, entries = _seal(rootfs)
        if os.geteuid() == 0:
            _make_image(rootfs, staging / IMAGE_FILE, size, entries)
            (staging / MOUNTED).mkdir(mode=0o755)
            _force_remove(rootfs)
        meta = ImageMeta(digest, size, time.time(), env, workdir)
        (staging / "image.json").write_text(json.dumps(asdict(meta)))
        staging.chmod(0o755)
        os.rename(staging, self.root / digest)  # atomic: whole image or none
        (self.root / "failed" / f"{digest}.json").unlink(missing_ok=True)
        return meta

    def discard(self, staging: Path) -> None:
        """A build that did not complete leaves nothing."""
        _force_remove(staging)

    def record_failure(self, digest: str, error: dict[str, Any]) -> None:
        path = self.root / "failed" / f"{digest}.json"
        path.write_text(json.dumps(error))

    def remove(self, digest: str) -> bool:
        path = self.root / digest
        if not path.exists():
            return False
        _unmount(path / MOUNTED)
        doomed = self.root / "tmp" / f"{digest}.removed-{secrets.token_hex(4)}"
        os.rename(path, doomed)  # gone for readers at once, deleted at leisure
        _force_remove(doomed)
        return True

    def digests(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "image.json").exists())


def _anchor(rootfs: Path) -> None:
    """The mount points a cell needs inside /etc, as plain files."""
    etc = rootfs / "etc"
    if etc.is_symlink() or (etc.exists() and not etc.is_dir()):
        etc.unlink()
    etc.mkdir(mode=0o755, exist_ok=True)
    for name in ETC_ANCHORS:
        path = etc / name
        if path.is_symlink() or not path.is_file():
            _force_remove(path)
            path.write_text("")


def _seal(rootfs: Path) -> tuple[int, int]:
    """Hands every file to the host's root (build uids are recycled for cells); returns the
    image's size in bytes and its number of entries. A file's hard links share its data, so
    its size counts once: a thousand links to one file must not size the image a thousand
    times over (mkfs.ext4 -d keeps them links)."""
    size, entries, privileged = 0, 1, os.geteuid() == 0
    linked: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            entries += 1
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in linked:
                size += st.st_size
                if st.st_nlink > 1:
                    linked.add((st.st_dev, st.st_ino))
            if privileged:
                os.lchown(path, 0, 0)
    if privileged:
        os.lchown(rootfs, 0, 0)
    return size, entries


def _make_image(rootfs: Path, image: Path, size: int, entries: int) -> None:
    """An ext4 filesystem holding the tree (mkfs.ext4 -d copies it, ownership included):
    the data with a tenth to spare, a block per entry for small files and directories."""
    blocks = (size + size // 10 + entries * 4096 + 16 * 1024 * 1024) // 4096
    inodes = entries + entries // 10 + 1024
    run_checked(
        [*MKFS, "-b", "4096", "-N", str(inodes), "-d", str(rootfs), str(image), str(blocks)]
    )
    image.chmod(0o600)


def _unmount(path: Path) -> None:
    if os.path.ismount(path):
        release_workspace(path)  # umount, lazily if something still holds it


def _force_remove(path: Path) -> None:
    """Removes a tree whose directories may have lost their write bits."""

    def retry(func: Any, target: str, _: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            func(target)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=retry)
    else:
        path.unlink(missing_ok=True)
