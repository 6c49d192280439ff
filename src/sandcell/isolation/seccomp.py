"""The cell's seccomp filter, compiled to classic BPF for ``bwrap --seccomp FD``.

A deny list on top of default ALLOW (SPEC §3): it removes the kernel attack surface that
untrusted code has no business touching (namespaces, mounts, tracing, eBPF, keyrings,
modules, io_uring, ...) while leaving ordinary Python/sh work untouched.  Only the native
architecture is in the filter, so i386 (``int 0x80``) and x32 (``nr | 0x40000000``)
syscalls hit the bad-arch action and kill the process: libseccomp emits the x32 check
itself for an x86_64 filter that does not include x32 (verified by the tests).
"""

import contextlib
import ctypes.util
import errno
import functools
import itertools
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no type information (pyproject.toml): both are Any to mypy
    from pyseccomp import Arg, SyscallFilter


def _import_pyseccomp() -> ModuleType:
    """pyseccomp finds libseccomp with ctypes.util.find_library, which asks the root's
    ld.so.cache. In a cell of an image (SPEC §12) that cache is the image's and knows nothing
    of the host's libraries, though the loader was given their directory
    (`--library-path`, images/stage.py): there, the soname alone loads the library."""
    try:
        import pyseccomp
    except RuntimeError:  # "Unable to find libseccomp"
        find = ctypes.util.find_library
        with contextlib.ExitStack() as restore:
            restore.callback(setattr, ctypes.util, "find_library", find)
            sonames = {"seccomp": "libseccomp.so.2", "c": "libc.so.6"}
            ctypes.util.find_library = lambda name: find(name) or sonames.get(name)
            import pyseccomp
    return pyseccomp


pyseccomp = _import_pyseccomp()

DENIED_SYSCALLS: tuple[str, ...] = (
    # tracing and reading/writing other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    # mounts, old and new API
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "mount_setattr",
    # namespaces (clone/clone3 are handled by argument below)
    "unshare",
    "setns",
    # kernel attack surface
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    "modify_ldt",
    "iopl",
    "ioperm",
    "uselib",
    # whole-machine administration
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "vhangup",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
)

_U32 = 0xFFFFFFFF
_CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)  # CLONE_NEWTIME (0x80) is only valid for clone3/unshare; in clone() it is CSIGNAL.
_DENIED_IOCTLS = (
    0x5412,  # TIOCSTI: push input into the controlling terminal
    0x541C,  # TIOCLINUX: same via the Linux console
)
# socket()/socketpair() families a cell may use (SPEC §3); AF_VSOCK reaches the hypervisor,
# AF_PACKET and the rest are kernel attack surface no Python job needs.
_ALLOWED_FAMILIES = (
    1,  # AF_UNIX
    2,  # AF_INET
    10,  # AF_INET6
    16,  # AF_NETLINK
)
# PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32|UNAME26 and the 0xffffffff query: everything
# else (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...) weakens the process.
_ALLOWED_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, _U32)


def _aligned_blocks(lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """Cover ``[lo, hi]`` with power-of-two aligned blocks, as ``(mask, value)`` pairs.

    libseccomp 2.5 takes one comparison per argument per rule, so an interval has to be
    expressed as a union of ``arg & mask == value`` rules.
    """
    while lo <= hi:
        size = lo & -lo if lo else _U32 + 1
        while lo + size - 1 > hi:
            size >>= 1
        yield _U32 & ~(size - 1), lo
        lo += size


def _complement(allowed: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Masked rules matching every 32-bit value (what the kernel reads) not in ``allowed``."""
    bounds = (-1, *sorted(allowed), _U32 + 1)
    for low, high in itertools.pairwise(bounds):
        yield from _aligned_blocks(low + 1, high - 1)


def _add(flt: "SyscallFilter", action: int, name: str, *args: "Arg") -> None:
    """Add a rule, skipping syscalls this libseccomp or architecture does not know."""
    nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    if nr >= 0:
        flt.add_rule(action, nr, *args)


@functools.cache
def build_filter() -> bytes:
    """Compile the filter once (libseccomp takes milliseconds) and return the BPF program."""
    eperm = pyseccomp.ERRNO(errno.EPERM)
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    flt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    for name in DENIED_SYSCALLS:
        _add(flt, eperm, name)
    for flag in _CLONE_NAMESPACE_FLAGS:
        _add(flt, eperm, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    # clone3 passes its flags behind a pointer; ENOSYS makes glibc fall back to clone().
    _add(flt, pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    # The kernel reads ioctl's cmd and personality's persona as 32-bit: mask the upper half
    # so that garbage in it cannot slip past an equality test.
    for cmd in _DENIED_IOCTLS:
        _add(flt, eperm, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _U32, cmd))
    for mask, value in _complement(_ALLOWED_PERSONALITIES):
        _add(flt, eperm, "personality", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, mask, value))
    no_family = pyseccomp.ERRNO(errno.EAFNOSUPPORT)  # what a kernel without the family says
    for mask, value in _complement(_ALLOWED_FAMILIES):
        for call in ("socket", "socketpair"):
            _add(flt, no_family, call, pyseccomp.Arg(0, pyseccomp.MASKED_EQ, mask, value))
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()


# -- the daemon's guard: what commands must not do to the thread that spawns them -----------

_F_SETOWN, _F_SETOWN_EX = 8, 15
_FIOSETOWN, _SIOCSPGRP = 0x8901, 0x8902
# (syscall, the arguments holding a target pid or tid)
_TARGETED_CALLS = (
    ("kill", (0,)),
    ("rt_sigqueueinfo", (0,)),
    ("tkill", (0,)),
    ("tgkill", (0, 1)),
    ("rt_tgsigqueueinfo", (0, 1)),
    ("pidfd_open", (0,)),
)
# Calls that tune a thread's scheduling, I/O priority or memory placement, by the position
# of their target. Same-uid rules let a command aim them at any daemon thread, and a static
# filter cannot tell the caller's own pid from another: only 0 ("myself") is let through.
_SELF_ONLY = (
    ("setpriority", 1),
    ("sched_setscheduler", 0),
    ("sched_setparam", 0),
    ("sched_setattr", 0),
    ("sched_setaffinity", 0),
    ("ioprio_set", 1),
    ("migrate_pages", 0),
    ("move_pages", 0),
)
# ...and the forms whose target 0 means every process of the caller's uid, the daemon's too.
_WHOLE_UID = (("setpriority", 2), ("ioprio_set", 3))  # PRIO_USER, IOPRIO_WHO_USER


def guard_daemon(daemon_pid: int, spawner_tid: int) -> None:
    """Load, into the calling thread only, a filter its future children inherit: no signal,
    pidfd or SIGIO ownership aimed at the daemon (`daemon_pid`) or at this thread, and no
    scheduling aimed at anyone but the caller.

    Landlock's signal scoping keeps commands from signalling the daemon's threads, except the
    one that spawns them (it shares their domain, daemon/exec/spawn.py): this closes that gap.
    Signals by pid, by tid, to a process group, through a pidfd, and SIGIO through F_SETOWN
    all name their target by number; ``pidfd_send_signal`` takes a ``/proc/<tid>`` directory
    fd too, which a filter cannot tell apart, so it is unavailable (ENOSYS: callers fall back
    to kill()). Nor may a command set another process's rlimits (RLIMIT_CPU on the daemon
    would have the kernel kill it).

    Nor may it renice, SCHED_IDLE, pin, lower the I/O priority of or move the memory of any
    thread but itself (target 0), nor of its uid as a whole: the daemon's threads come and
    go (worker threads), so they cannot be listed here. A command still tunes itself (0),
    what it starts after (children inherit: `nice`, `chrt`, `taskset`, `ionice` as
    wrappers) and its own process group (`renice -g 0`: commands lead sessions of their
    own, which the daemon is never in). Refused with them: naming itself by number
    (`renice -p $$`), and setting another of its own threads (pthread_setaffinity_np).
    """
    eperm = pyseccomp.ERRNO(errno.EPERM)
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    flt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    targets = {daemon_pid, spawner_tid}
    signed = {t & _U32 for t in targets} | {-t & _U32 for t in targets}  # a process group too
    for name, positions in _TARGETED_CALLS:
        for position in positions:
            for value in signed:
                _add(flt, eperm, name, pyseccomp.Arg(position, pyseccomp.MASKED_EQ, _U32, value))
    for value in signed:
        setown = pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _U32, _F_SETOWN)
        _add(flt, eperm, "fcntl", setown, pyseccomp.Arg(2, pyseccomp.MASKED_EQ, _U32, value))
    # These name their target behind a pointer: refused whatever it is.
    _add(flt, eperm, "fcntl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _U32, _F_SETOWN_EX))
    for cmd in (_FIOSETOWN, _SIOCSPGRP):
        _add(flt, eperm, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _U32, cmd))
    _add(flt, pyseccomp.ERRNO(errno.ENOSYS), "pidfd_send_signal")
    others, setting = pyseccomp.Arg(0, pyseccomp.NE, 0), pyseccomp.Arg(2, pyseccomp.NE, 0)
    _add(flt, eperm, "prlimit64", others, setting)
    # A 64-bit "not 0" refuses garbage in the upper half too (the kernel reads a pid_t).
    for name, position in _SELF_ONLY:
        _add(flt, eperm, name, pyseccomp.Arg(position, pyseccomp.NE, 0))
    for name, which in _WHOLE_UID:
        _add(flt, eperm, name, pyseccomp.Arg(0, pyseccomp.MASKED_EQ, _U32, which))
    flt.load()
