"""A cell's root built from inside its own user and mount namespaces, with the kernel's mount API.

What bwrap does from outside today (isolation/bwrap.py), for a process that has already
unshared its user and mount namespaces (a zygote's child): every source of the plan is taken
first as a detached clone (`open_tree`), flagged read-only/nosuid/nodev on the clone itself
(`mount_setattr`), and the cell's own filesystems are made detached too (`fsopen`/`fsmount`),
so a plan naming a missing path fails before anything is attached anywhere. Then a fresh
tmpfs becomes the root (`pivot_root`), the old root is detached before any of the cell's paths
is resolved (a link in the plan's destinations cannot lead back to the host), the clones are
moved to their places (`move_mount`), and the root itself is made read-only: what the plan
does not mark writable is not (bwrap's `--remount-ro /`).

Each flag is set by the process that built the mounts, which can still clear it. `seal`
enters a further user and mount namespace: the kernel then locks every flag and every mount
over another (clearing RDONLY fails with EPERM, even for that namespace's root).
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 numbers; the mount API's (428-442) are the same on every architecture, the older two not.
_SYSCALLS = {
    "x86_64": {
        "pivot_root": 155,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "mount_setattr": 442,
    }
}

AT_FDCWD = -100
_AT_EMPTY_PATH, _AT_RECURSIVE = 0x1000, 0x8000
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_MNT_DETACH = 2
_MS_PRIVATE = 1 << 18

MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
_SAFE = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _nr(name: str) -> int:
    table = _SYSCALLS.get(platform.machine())
    if table is None:
        raise OSError(38, f"{name}: no syscall numbers for {platform.machine()} (x86_64 only)")
    return table[name]


def _check(ret: int, call: str, path: str | None) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}", path)
    return ret


def _syscall(name: str, path: str, *args: object) -> int:
    return _check(_libc.syscall(ctypes.c_long(_nr(name)), *args), name, path)


def _path(path: str) -> ctypes.c_char_p:
    return ctypes.c_char_p(os.fsencode(path))


def open_tree(path: str, dirfd: int = AT_FDCWD) -> int:
    """A detached clone of the mount tree at `path`, with every mount beneath it (a tree
    taken from a more privileged namespace has locked children: only the whole of it moves)."""
    flags = _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC
    return _syscall("open_tree", path, ctypes.c_int(dirfd), _path(path), ctypes.c_uint(flags))


def move_mount(fd: int, to_path: str, to_dirfd: int = AT_FDCWD) -> None:
    """Attaches the detached mount `fd` at `to_path`."""
    _syscall(
        "move_mount",
        to_path,
        ctypes.c_int(fd),
        _path(""),
        ctypes.c_int(to_dirfd),
        _path(to_path),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
    )


def mount_setattr(
    target: int | str,
    attr_set: int = 0,
    attr_clr: int = 0,
    *,
    private: bool = False,
    recursive: bool = True,
) -> None:
    """Sets and clears MOUNT_ATTR_* flags on a mount (an fd from open_tree/fsmount, or a
    path), on every mount beneath it when `recursive`; `private` ends its propagation."""
    attr = _MountAttr(attr_set, attr_clr, _MS_PRIVATE if private else 0, 0)
    dirfd, path, flags = (
        (target, "", _AT_EMPTY_PATH) if isinstance(target, int) else (AT_FDCWD, target, 0)
    )
    flags |= _AT_RECURSIVE if recursive else 0
    _syscall(
        "mount_setattr",
        path or "<fd>",
        ctypes.c_int(dirfd),
        _path(path),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )


def fsmount(fstype: str, options: dict[str, str], attrs: int) -> int:
    """A detached new filesystem of `fstype` (tmpfs, proc) with string `options`."""
    fs = _syscall("fsopen", fstype, _path(fstype), ctypes.c_uint(_FSOPEN_CLOEXEC))
    try:
        for key, value in options.items():
            _syscall(
                "fsconfig",
                f"{fstype} {key}={value}",
                ctypes.c_int(fs),
                ctypes.c_uint(_FSCONFIG_SET_STRING),
                _path(key),
                _path(value),
                ctypes.c_int(0),
            )
        _syscall(
            "fsconfig",
            fstype,
            ctypes.c_int(fs),
            ctypes.c_uint(_FSCONFIG_CMD_CREATE),
            None,
            None,
            ctypes.c_int(0),
        )
        return _syscall(
            "fsmount",
            fstype,
            ctypes.c_int(fs),
            ctypes.c_uint(_FSMOUNT_CLOEXEC),
            ctypes.c_uint(attrs),
        )
    finally:
        os.close(fs)


def pivot_root(new_root: str, put_old: str) -> None:
    _syscall("pivot_root", new_root, _path(new_root), _path(put_old))


def umount_detach(path: str) -> None:
    _check(_libc.umount2(os.fsencode(path), _MNT_DETACH), "umount2", path)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare", None)


def enter_user_namespace(flags: int, inside_uid: int, inside_gid: int) -> None:
    """Unshares a new user namespace (and the other namespaces in `flags`) and maps this
    process's ids to `inside_*` there: the one mapping a process may write for itself
    (setgroups denied first). The caller must be single-threaded."""
    uid, gid = os.geteuid(), os.getegid()  # unmapped, and so unknown, once unshared
    unshare(CLONE_NEWUSER | flags)
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{inside_uid} {uid} 1"),
        ("gid_map", f"{inside_gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


# The plan: what the cell's root holds, in order (a destination inside an earlier entry's
# mount must already exist there: a read-only bind cannot grow a mount point).


@dataclass(frozen=True)
class Bind:
    """A host path (directory or file) at `dest`: read-only unless `writable`, always
    nosuid, and nodev unless `devices` (bwrap's --dev-bind); `optional` skips a missing one
    (--ro-bind-try)."""

    source: str
    dest: str
    writable: bool = False
    devices: bool = False
    optional: bool = False


@dataclass(frozen=True)
class Tmpfs:
    """A writable tmpfs of `size` bytes, nosuid, nodev."""

    dest: str
    size: int
    mode: int = 0o1777


@dataclass(frozen=True)
class Proc:
    """A proc of the calling process's PID namespace (which must be its user namespace's)."""

    dest: str = "/proc"


@dataclass(frozen=True)
class Devpts:
    """A devpts instance of the cell's own (ptys; with a `/dev/ptmx` link to `pts/ptmx`)."""

    dest: str = "/dev/pts"


@dataclass(frozen=True)
class File:
    """A file of the root's own with `content`; read-only with the root."""

    dest: str
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Symlink:
    dest: str
    target: str


Entry = Bind | Tmpfs | Proc | Devpts | File | Symlink


def build_root(plan: Sequence[Entry], *, root_size: int = 1 << 20, attach_at: str = "/tmp") -> None:  # noqa: S108
    """Makes the plan this process's root, from a fresh tmpfs of `root_size` bytes, and
    chdirs to it. `attach_at`, any directory of the old root, holds the new root for as
    long as pivot_root needs a path to it (in this mount namespace only).

    Fails closed: an OSError naming the path. Up to the pivot nothing is left attached;
    after it the old root is gone and a half-built root remains, so the caller must exit
    (its namespace, and every mount in it, dies with it)."""
    with ExitStack() as fds:
        mount_setattr("/", private=True)  # pivot_root refuses shared mounts
        ready = [(e, _detached(e, fds)) for e in plan]
        root = fds.enter_context(_closing(fsmount("tmpfs", _tmpfs(root_size, 0o755), _SAFE)))
        cwd = fds.enter_context(_closing(os.open(".", os.O_PATH | os.O_CLOEXEC)))
        move_mount(root, attach_at)
        try:
            os.chdir(attach_at)
            pivot_root(".", ".")  # the old root now lies on top of the new one: detach it
        except BaseException:
            os.fchdir(cwd)
            umount_detach(attach_at)
            raise
        umount_detach(".")
        os.chdir("/")
        for entry, (fd, is_dir) in ready:
            _place(entry, fd, is_dir)
        mount_setattr("/", MOUNT_ATTR_RDONLY, recursive=False)


def seal(inside_uid: int, inside_gid: int) -> None:
    """Enters a new user and mount namespace over the built root: the kernel locks each
    mount's flags and each mount over another, so not even root there can clear RDONLY,
    NOSUID or NODEV or uncover what lies beneath. `inside_*` are the ids there."""
    enter_user_namespace(CLONE_NEWNS, inside_uid, inside_gid)


def _tmpfs(size: int, mode: int) -> dict[str, str]:
    return {"source": "sandcell", "size": str(size), "mode": f"{mode:o}"}


@contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _detached(entry: Entry, fds: ExitStack) -> tuple[int | None, bool]:
    """The detached mount an entry moves to its place (None: none, or an optional
    bind's missing source), taken before the old root goes, and whether it is a directory."""
    fd: int | None = None
    if isinstance(entry, Bind):
        if entry.optional and not os.path.lexists(entry.source):
            return None, False
        fd = fds.enter_context(_closing(open_tree(entry.source)))
        attrs = MOUNT_ATTR_NOSUID | (0 if entry.devices else MOUNT_ATTR_NODEV)
        attrs |= 0 if entry.writable else MOUNT_ATTR_RDONLY
        mount_setattr(fd, attrs, private=True)
        return fd, stat.S_ISDIR(os.fstat(fd).st_mode)
    if isinstance(entry, Tmpfs):
        fd = fds.enter_context(_closing(fsmount("tmpfs", _tmpfs(entry.size, entry.mode), _SAFE)))
    elif isinstance(entry, Proc):  # the kernel lets a proc be made while a full one is in view
        fd = fds.enter_context(
            _closing(fsmount("proc", {"source": "proc"}, _SAFE | MOUNT_ATTR_NOEXEC))
        )
    elif isinstance(entry, Devpts):
        options = {"source": "devpts", "ptmxmode": "0666", "mode": "0620"}
        fd = fds.enter_context(
            _closing(fsmount("devpts", options, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC))
        )
    return fd, True


def _place(entry: Entry, fd: int | None, is_dir: bool) -> None:
    parent = os.path.dirname(entry.dest)
    os.makedirs(parent, 0o755, exist_ok=True)
    if isinstance(entry, Symlink):
        os.symlink(entry.target, entry.dest)
    elif isinstance(entry, File):
        fd = os.open(entry.dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, entry.mode)
        with open(fd, "wb") as f:
            f.write(entry.content)
        os.chmod(entry.dest, entry.mode)  # the umask's share
    elif fd is not None:
        if not os.path.lexists(entry.dest):
            if is_dir:
                os.mkdir(entry.dest, 0o755)
            else:
                os.close(os.open(entry.dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        move_mount(fd, entry.dest)
