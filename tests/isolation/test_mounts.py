"""The cell's root built from inside (isolation/mounts.py), for real, in forked children.

Each case forks a child that enters its own user, mount and PID namespaces (mapped to the
caller's own ids), forks again so that the grandchild is the PID namespace's first process,
and builds the root there: the host's mount table is never touched. The grandchild sends its
findings back over a pipe as JSON.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import signal
import stat
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sandcell.isolation import mounts
from sandcell.isolation.mounts import Bind, Devpts, File, Proc, Symlink, Tmpfs

_DEADLINE_S = 10.0
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4


def _errno(call: Callable[[], object]) -> str:
    """The errno name `call` fails with, or 'ok'."""
    try:
        call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def _supported() -> str:
    """Why the calls cannot be tried here ('' when they can)."""
    if os.uname().machine != "x86_64":
        return "mounts.py knows the x86_64 syscall numbers only"
    if not os.path.exists("/proc/self/ns/user"):
        return "the kernel has no user namespaces"
    if _errno(lambda: mounts.mount_setattr(-1)) == "ENOSYS":  # the newest call (5.12)
        return f"the kernel ({os.uname().release}) has no mount_setattr"
    return ""


pytestmark = pytest.mark.skipif(bool(_supported()), reason=_supported() or "-")


def _in_cell(body: Callable[[], dict[str, Any]], *, uid: int | None = None) -> dict[str, Any]:
    """`body`'s result, run as the first process of fresh user, mount and PID namespaces
    whose root is this process's own ids (`uid`: another host uid instead)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's lines run after the fork
        os.close(read_end)
        os._exit(_child(body, uid, write_end))
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + _DEADLINE_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            if select.select([read_end], [], [], left)[0]:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_end)
        status = os.waitpid(pid, 0)[1]
    assert os.waitstatus_to_exitcode(status) == 0, f"the child failed: {status}"
    assert chunks, "the child reported nothing"
    result: dict[str, Any] = json.loads(b"".join(chunks))
    return result


def _report(write_end: int, body: Callable[[], dict[str, Any] | None]) -> None:
    """Sends `body`'s result, or what it raised, unless it returned None."""
    try:
        out = body()
    except BaseException as exc:
        out = {"raised": repr(exc)}
    if out is not None:
        os.write(write_end, json.dumps(out).encode())


def _child(body: Callable[[], dict[str, Any]], uid: int | None, write_end: int) -> int:
    """The forked child: enters the namespaces, runs `body` in its own child (the PID
    namespace's first process), and returns the exit code for os._exit."""
    libc = ctypes.CDLL(None)
    code = [1]

    def enter() -> None:
        if uid is not None:  # an unprivileged host uid, as a cell's would be
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            libc.prctl(_PR_SET_DUMPABLE, 1)  # a changed uid hid its /proc/self/*_map
        mounts.enter_user_namespace(mounts.CLONE_NEWNS | mounts.CLONE_NEWPID, 0, 0)
        inner = os.fork()
        if inner == 0:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # not outliving a killed parent
            _report(write_end, body)
            os._exit(0)
        code[0] = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1])

    _report(write_end, enter)
    return code[0]


def _system() -> list[mounts.Entry]:
    """The host's system, read-only, as a cell sees it (bwrap.host_system's shape)."""
    links = [Symlink(p, os.readlink(p)) for p in ("/bin", "/sbin", "/lib", "/lib64")]
    return [Bind("/usr", "/usr"), *[s for s in links if os.path.islink(s.dest)]]


def _mountinfo() -> dict[str, list[str]]:
    """Mount point -> (per-mount options, filesystem type, source, superblock options)."""
    table = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        tail = fields[fields.index("-") + 1 :]
        table[fields[4]] = [fields[5], *tail]
    return table


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host tree for the plan's binds: ro/ (a file), rw/, and a file to bind alone."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_text("host's")
    (tmp_path / "rw").mkdir()
    (tmp_path / "alone").write_text("one file")
    return tmp_path


def _plan(host: Path) -> list[mounts.Entry]:
    return [
        *_system(),
        Bind(str(host / "ro"), "/ro"),
        Bind(str(host / "ro"), "/ro2"),
        Bind(str(host / "alone"), "/etc/alone"),
        Bind(str(host / "missing"), "/etc/missing", optional=True),
        Bind(str(host / "rw"), "/workspace", writable=True),
        Tmpfs("/tmp", 64 * 1024),
        Proc(),
        File("/etc/hostname", b"sandcell\n"),
    ]


def test_read_only_binds_refuse_writes_and_once_sealed_refuse_remounting(host: Path) -> None:
    def body() -> dict[str, Any]:
        mounts.build_root(_plan(host))
        out = {
            "write": _errno(lambda: Path("/ro/f").write_text("x")),
            "create": _errno(lambda: Path("/ro/new").write_text("x")),
            "file": _errno(lambda: Path("/etc/alone").write_text("x")),
            "usr": _errno(lambda: Path("/usr/new").write_text("x")),
            "root": _errno(lambda: os.mkdir("/new")),
            "generated": _errno(lambda: Path("/etc/hostname").write_text("x")),
            "content": Path("/ro/f").read_text() + "|" + Path("/etc/hostname").read_text(),
            # the builder still holds the flags: it may clear them, as a zygote child must not
            "builder_clears": _errno(lambda: mounts.mount_setattr("/ro2", 0, 1)),
        }
        mounts.seal(0, 0)  # root there: the lock, not a lack of rights, refuses
        clear = mounts.MOUNT_ATTR_RDONLY
        out["sealed_ro"] = _errno(lambda: mounts.mount_setattr("/ro", 0, clear))
        out["sealed_root"] = _errno(lambda: mounts.mount_setattr("/", 0, clear, recursive=False))
        out["sealed_nosuid"] = _errno(lambda: mounts.mount_setattr("/workspace", 0, 2))
        out["sealed_uncover"] = _errno(lambda: mounts.umount_detach("/ro"))
        out["sealed_write"] = _errno(lambda: Path("/ro/f").write_text("x"))
        return out

    out = _in_cell(body)
    assert out.pop("content") == "host's|sandcell\n"
    assert out.pop("builder_clears") == "ok"
    assert out.pop("sealed_uncover") in ("EINVAL", "EPERM")
    assert set(out.values()) == {"EROFS", "EPERM"}, out
    assert {k for k, v in out.items() if v == "EPERM"} == {
        "sealed_ro",
        "sealed_root",
        "sealed_nosuid",
    }
    assert (host / "ro" / "f").read_text() == "host's"
    assert not (host / "ro" / "new").exists()


def test_writable_binds_and_tmpfs_take_writes_and_tmpfs_size_holds(host: Path) -> None:
    def body() -> dict[str, Any]:
        mounts.build_root(_plan(host))
        Path("/workspace/made").write_text("in the cell")
        Path("/tmp/small").write_bytes(b"x" * 1024)
        big = _errno(lambda: Path("/tmp/big").write_bytes(b"x" * 256 * 1024))
        return {"big": big, "listing": sorted(os.listdir("/workspace"))}

    out = _in_cell(body)
    assert out == {"big": "ENOSPC", "listing": ["made"]}
    assert (host / "rw" / "made").read_text() == "in the cell"


def test_nothing_outside_the_plan_is_reachable(host: Path) -> None:
    def body() -> dict[str, Any]:
        mounts.build_root(_plan(host))
        paths = ["/root", "/home", "/work", str(host), "/etc/passwd", "/etc/missing", "/var"]
        return {
            "gone": {p: _errno(partial(os.stat, p)) for p in paths},
            "top": sorted(os.listdir("/")),
            "etc": sorted(os.listdir("/etc")),
            "dotdot": os.path.samestat(os.stat("/.."), os.stat("/")),
            "mounts": sorted(_mountinfo()),
            "tmp": sorted(os.listdir("/tmp")),
        }

    out = _in_cell(body)
    assert set(out["gone"].values()) == {"ENOENT"}, out["gone"]
    links = [s.dest.lstrip("/") for s in _system() if isinstance(s, Symlink)]
    assert out["top"] == sorted(["etc", "proc", "ro", "ro2", "tmp", "usr", "workspace", *links])
    assert out["etc"] == ["alone", "hostname"]
    assert out["dotdot"] is True
    assert out["tmp"] == []
    wanted = {"/", "/usr", "/ro", "/ro2", "/etc/alone", "/workspace", "/tmp", "/proc"}
    assert set(out["mounts"]) == wanted


def test_proc_is_the_cells_own_pid_namespace(host: Path) -> None:
    def body() -> dict[str, Any]:
        mounts.build_root(_plan(host))
        pids = sorted(e for e in os.listdir("/proc") if e.isdigit())
        return {"self": os.readlink("/proc/self"), "pids": pids, "getpid": os.getpid()}

    assert _in_cell(body) == {"self": "1", "pids": ["1"], "getpid": 1}


def test_mount_flags_and_what_mountinfo_names(host: Path) -> None:
    def body() -> dict[str, Any]:
        mounts.build_root(_plan(host))
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        roots = {f[4]: f[3] for f in (line.split() for line in lines)}
        return {"table": _mountinfo(), "roots": roots}

    out = _in_cell(body)
    table = out["table"]
    # what still names the host: a bind's root within its filesystem (the stage's overlays
    # hide it, staging.py); the cell's own filesystems are whole
    assert out["roots"]["/ro"] == str(host / "ro")
    assert {out["roots"][p] for p in ("/", "/tmp", "/proc")} == {"/"}
    for point in ("/", "/ro", "/workspace", "/tmp", "/usr", "/proc", "/etc/alone"):
        assert {"nosuid", "nodev"} <= set(table[point][0].split(",")), (point, table[point])
    for point in ("/", "/ro", "/usr", "/etc/alone"):
        assert table[point][0].startswith("ro,"), (point, table[point])
    for point in ("/workspace", "/tmp"):
        assert table[point][0].startswith("rw,"), (point, table[point])
    assert "noexec" in table["/proc"][0].split(",")
    assert table["/"][1:3] == ["tmpfs", "sandcell"]
    assert table["/tmp"][1:3] == ["tmpfs", "sandcell"]
    assert table["/proc"][1:3] == ["proc", "proc"]
    for point in ("/", "/tmp", "/proc"):
        assert "/" not in " ".join(table[point][2:]), (point, table[point])


def test_a_cell_mapped_to_an_unprivileged_host_uid_shows_it_on_its_tmpfs() -> None:
    """What a zygote's child mapped to a cell's host uid shows: the kernel prints a tmpfs's
    owner as the host sees it (why staging.py mounts them as root); proc shows nothing."""

    def body() -> dict[str, Any]:
        mounts.build_root([Tmpfs("/tmp", 64 * 1024), Proc()])
        return _mountinfo()

    table = _in_cell(body, uid=200777)
    assert "uid=200777" in table["/"][3] and "uid=200777" in table["/tmp"][3], table
    assert table["/proc"][1:] == ["proc", "proc", "rw"], table


@pytest.mark.parametrize("what", ["source", "attach point"])
def test_a_missing_path_fails_naming_it_and_leaves_nothing_mounted(host: Path, what: str) -> None:
    """A missing bind source fails before anything is attached; a missing attach point
    once the plan's mounts are all made, detached: neither leaves a mount behind."""
    missing = str(host / "missing")
    plan = [*_plan(host), Bind(missing, "/data")] if what == "source" else _plan(host)
    attach_at = missing if what == "attach point" else "/tmp"

    def body() -> dict[str, Any]:
        before = _mountinfo()
        try:
            mounts.build_root(plan, attach_at=attach_at)
        except OSError as exc:
            raised = [exc.errno, exc.filename, str(exc)]
        else:
            raised = []
        return {"raised": raised, "same": _mountinfo() == before, "cwd": os.getcwd()}

    with open("/proc/mounts") as f:
        host_before = f.read()
    out = _in_cell(body)
    with open("/proc/mounts") as f:
        assert f.read() == host_before
    assert out["raised"][:2] == [errno.ENOENT, missing]
    assert missing in out["raised"][2]
    assert out["same"] is True
    assert out["cwd"] == os.getcwd()


def test_a_link_in_the_plan_cannot_lead_a_destination_back_to_the_host(host: Path) -> None:
    """Destinations are resolved only after the old root is gone: a link to a host
    directory leads nowhere, and the build fails instead of writing there."""
    outside = host / "outside"
    outside.mkdir()

    def body() -> dict[str, Any]:
        plan = [Symlink("/link", str(outside)), File("/link/f", b"x")]
        return {"raised": _errno(lambda: mounts.build_root(plan))}

    assert _in_cell(body) == {"raised": "EEXIST"}
    assert list(outside.iterdir()) == []


def test_a_dev_of_the_cells_own_gives_working_nodes_and_ptys() -> None:
    """bwrap's --dev from the plan: a tmpfs, the host's harmless nodes bound with their
    devices, a devpts of the cell's own and the ptmx link."""

    def body() -> dict[str, Any]:
        mounts.build_root(
            [
                Tmpfs("/dev", 64 * 1024, 0o755),
                Bind("/dev/null", "/dev/null", writable=True, devices=True),
                Bind("/dev/urandom", "/dev/urandom", writable=True, devices=True),
                Devpts(),
                Symlink("/dev/ptmx", "pts/ptmx"),
                Proc(),
            ]
        )
        Path("/dev/null").write_text("discarded")
        primary, secondary = os.openpty()
        os.write(secondary, b"through the pty")
        return {
            "random": len(Path("/dev/urandom").open("rb").read(8)),
            "pty": os.read(primary, 64).decode(),
            "name": os.ttyname(secondary),
            "pts": _mountinfo()["/dev/pts"],
            "nodes": _errno(lambda: os.mknod("/dev/evil", 0o600 | stat.S_IFCHR, os.makedev(1, 3))),
        }

    out = _in_cell(body)
    assert out["random"] == 8
    assert out["pty"] == "through the pty"
    assert out["name"] == "/dev/pts/0"
    assert out["pts"][1:3] == ["devpts", "devpts"]
    assert {"nosuid", "noexec"} <= set(out["pts"][0].split(","))
    assert out["nodes"] == "EPERM"  # a user namespace's root makes no device nodes
