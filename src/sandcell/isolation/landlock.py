"""Landlock for a cell: writes only beneath chosen paths, optionally no TCP (SPEC §3).

Landlock is the unprivileged second fence behind the mount namespace: even if a bind mount
is wrong, the cell cannot write outside its workspace.  Only write-type rights are handled,
so reading and executing stay allowed everywhere the mount namespace shows.

``restrict_self`` confines the calling thread and everything it later starts, irrevocably:
call it in a process before it starts threads, or in the one thread to confine (the daemon's
spawner thread nests a stricter domain inside the daemon's this way).  Writing to a device
(``/dev/null``, a pty) is a write too: pass such files in ``writable_paths``.
"""

import ctypes
import os
import stat
from collections.abc import Sequence

# Generic syscall numbers: the same on every architecture (they postdate the unified table).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_FS_WRITE_FILE = 1 << 1
_FS_TRUNCATE = 1 << 14
_FS_IOCTL_DEV = 1 << 15
# Write-type filesystem rights by the ABI that introduced them.
_FS_WRITE_RIGHTS_BY_ABI = {
    1: _FS_WRITE_FILE
    | (1 << 4)  # REMOVE_DIR
    | (1 << 5)  # REMOVE_FILE
    | (1 << 6)  # MAKE_CHAR
    | (1 << 7)  # MAKE_DIR
    | (1 << 8)  # MAKE_REG
    | (1 << 9)  # MAKE_SOCK
    | (1 << 10)  # MAKE_FIFO
    | (1 << 11)  # MAKE_BLOCK
    | (1 << 12),  # MAKE_SYM
    2: 1 << 13,  # REFER: link/rename across directories
    3: _FS_TRUNCATE,
    5: _FS_IOCTL_DEV,
}
# The only write rights that apply to a non-directory; the kernel rejects the others there.
_FS_FILE_RIGHTS = _FS_WRITE_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP | CONNECT_TCP (ABI 4)
_SCOPES = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6)
SIGNAL_SCOPE_ABI = 6

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LandlockUnavailable(Exception):
    """Landlock cannot be enforced as asked on this host: the cell must not start (fail closed)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise LandlockUnavailable(f"{what} failed: {os.strerror(err)} (errno {err})")
    return ret


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when it lacks Landlock or has it disabled."""
    ret = _libc.syscall(
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
        ctypes.c_uint32(_CREATE_RULESET_VERSION),
    )  # fmt: skip
    return max(int(ret), 0)


def _no_scoping(abi: int) -> str:
    return f"signal scoping needs Landlock ABI {SIGNAL_SCOPE_ABI}, this kernel has ABI {abi}"


def cell_support() -> tuple[bool, str]:
    """Whether a cell can be confined here as SPEC §3 asks, and why not: writes confined, and
    commands scoped away from the daemon's signals (``LANDLOCK_SCOPE_SIGNAL``, ABI 6)."""
    abi = abi_version()
    if abi < 1:
        return False, "the kernel has no Landlock (or it is disabled)"
    if abi < SIGNAL_SCOPE_ABI:
        return False, _no_scoping(abi)
    return True, f"ABI {abi}"


def restrict_self(
    writable_paths: Sequence[str], deny_tcp: bool, *, require_scoping: bool = False
) -> int:
    """Allow writes only beneath ``writable_paths`` (and, if asked, no TCP bind/connect).

    At ABI >= 6 the calling thread and its children also cannot signal, or connect to
    abstract unix sockets of, processes outside their Landlock domain (``require_scoping``:
    or fail).  Returns the ABI applied; raises ``LandlockUnavailable`` rather than enforcing
    less than asked.
    """
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("Landlock is not supported or is disabled on this kernel")
    if deny_tcp and abi < 4:
        raise LandlockUnavailable(f"denying TCP needs Landlock ABI 4, this kernel has ABI {abi}")
    if require_scoping and abi < SIGNAL_SCOPE_ABI:
        raise LandlockUnavailable(_no_scoping(abi))
    handled_fs = 0
    for since, rights in _FS_WRITE_RIGHTS_BY_ABI.items():
        if abi >= since:
            handled_fs |= rights
    attr = _RulesetAttr(handled_fs, _NET_TCP if deny_tcp else 0, _SCOPES if abi >= 6 else 0)
    # Size the struct to the fields this ABI knows, as the UAPI expects.
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset_fd = _check(
        _libc.syscall(
            ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
            ctypes.c_size_t(size), ctypes.c_uint32(0),
        ),
        "landlock_create_ruleset",
    )  # fmt: skip
    try:
        for path in writable_paths:
            _allow_writes_beneath(ruleset_fd, path, handled_fs)
        _check(
            _libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0),
                        ctypes.c_ulong(0), ctypes.c_ulong(0)),
            "prctl(PR_SET_NO_NEW_PRIVS)",
        )  # fmt: skip
        _check(
            _libc.syscall(
                ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF), ruleset_fd, ctypes.c_uint32(0)
            ),
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset_fd)
    return abi


def _allow_writes_beneath(ruleset_fd: int, path: str, handled_fs: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise LandlockUnavailable(f"cannot open writable path {path!r}: {exc}") from exc
    try:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        rule = _PathBeneathAttr(handled_fs if is_dir else handled_fs & _FS_FILE_RIGHTS, fd)
        _check(
            _libc.syscall(
                ctypes.c_long(_SYS_LANDLOCK_ADD_RULE), ruleset_fd,
                ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0),
            ),
            f"landlock_add_rule({path!r})",
        )  # fmt: skip
    finally:
        os.close(fd)
