"""Escape attempts, each carried out for real from inside a cell (SPEC §3).

Every test runs the attack as the untrusted code would (a command through the daemon) and
checks both that the attempt failed inside and that nothing changed on the host.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pyseccomp
import pytest

import sandcell
from cells.conftest import (
    CELL_UIDS,
    Cell,
    CellFactory,
    read_proc,
    status_ids,
    wait_until,
)
from sandcell.isolation.policy import CellPolicy

HOST_SECRET = f"host-secret-{secrets.token_hex(12)}"
SECRET_VARS = {
    "SANDCELL_TEST_HOST_SECRET": HOST_SECRET,
    "AWS_SECRET_ACCESS_KEY": f"aws-{HOST_SECRET}",
    "SANDCELL_STORE_KEY": f"store-{HOST_SECRET}",
}
SIGSYS = 31


@pytest.fixture(scope="module")
def cell(factory: CellFactory) -> Iterator[Cell]:
    """The module's shared cell, created while the host process holds secrets in its env."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in SECRET_VARS.items():
            mp.setenv(name, value)
        c = factory.create()
        yield c
    c.destroy()


def nr(name: str) -> int:
    """The native syscall number (host and cell share the kernel and the architecture)."""
    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    assert number >= 0, name
    return number


# -- secrets of the host -------------------------------------------------------------------


def test_host_secret_not_in_command_environment(cell: Cell) -> None:
    for command in ("env", ["/usr/bin/env"], "cat /proc/self/environ | tr '\\0' '\\n'"):
        r = cell.run(command)
        assert r["exit_code"] == 0, r
        assert "PATH=" in r["stdout"]
        assert HOST_SECRET not in r["stdout"] + r["stderr"]
        for name in SECRET_VARS:
            assert f"{name}=" not in r["stdout"]


PROC_DUMP = """
import json, os
out = {}
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    for what in ("environ", "cmdline", "status", "maps", "mem"):
        path = f"/proc/{pid}/{what}"
        try:
            with open(path, "rb") as f:
                data = f.read(4 << 20)
            out[path] = data.decode("latin-1")
        except OSError as exc:
            out[path] = f"error {exc.errno}"
    for tid in os.listdir(f"/proc/{pid}/task"):
        path = f"/proc/{pid}/task/{tid}/environ"
        try:
            with open(path, "rb") as f:
                out[path] = f.read().decode("latin-1")
        except OSError as exc:
            out[path] = f"error {exc.errno}"
print(json.dumps(out))
"""


def test_host_secret_not_readable_from_any_visible_process(cell: Cell) -> None:
    # Some background process of our own, to be sure more than the probe is looked at.
    cell.run("sleep 30 >/dev/null 2>&1 &")
    seen = cell.py_json(PROC_DUMP)
    readable = {path for path, data in seen.items() if not data.startswith("error ")}
    assert "/proc/1/cmdline" in readable  # the probe did read other processes
    sleeper = [p for p, data in seen.items() if data.startswith("sleep\0" + "30")]
    assert len(sleeper) == 1, "the background command is not visible"
    sleeper_env = sleeper[0].replace("cmdline", "environ")
    assert sleeper_env in readable and "PATH=" in seen[sleeper_env]  # a command's env, read
    leaks = [path for path, data in seen.items() if HOST_SECRET in data]
    assert leaks == []
    # The secret never reached the cell: as root on the host, read every cell process's env.
    for pid in cell.host_pids():
        for what in ("environ", "cmdline"):
            assert HOST_SECRET.encode() not in read_proc(pid, what), (pid, what)


def test_host_secret_not_on_the_cells_filesystem(cell: Cell) -> None:
    places = "/etc /run /tmp /dev/shm /workspace /opt/sandcell/src /proc/self/environ"
    # A pattern that matches the secret without being it: the cell is never handed it.
    pattern = HOST_SECRET.replace("secret", "secre[t]")
    r = cell.sh(f"grep -rIl -- '{pattern}' {places} 2>/dev/null; echo done")
    assert r["stdout"] == "done\n"


def test_mount_table_names_nothing_of_the_host(cell: Cell) -> None:
    """mountinfo shows each mount's root within its filesystem: bind a host directory and its
    host path shows. Everything is staged under neutral names instead (isolation/launch.py)."""
    table = cell.run("cat /proc/self/mountinfo /proc/1/mountinfo /proc/self/mounts")["stdout"]
    venvs = ("/opt/sandcell/venv", "/.sandcell/venv")  # a host cell's, an image cell's
    assert "/workspace" in table and any(v in table for v in venvs)  # the right file was read
    checkout = Path(sandcell.__file__).resolve().parents
    host_names = {
        str(cell.owner.cells.cells_dir),
        str(cell.owner.root),
        cell.info.cell_id,
        cell.sandbox_id,
        sys.prefix,
        str(Path(sys.prefix).resolve()),
        *(str(p) for p in checkout if len(p.parts) > 2),  # not / or a top-level like /tmp
    }
    assert {name for name in host_names if name in table} == set()
    # Nor the host uid, anywhere: not as a directory, nor in a tmpfs's options (`uid=N`,
    # `gid=N`: the kernel prints a tmpfs's owner as the host sees it, so the cell's own
    # tmpfs are mounted by root on the stage, which leaves them no owner to print).
    assert str(cell.info.uid) not in re.findall(r"\d+", table), [
        line for line in table.splitlines() if str(cell.info.uid) in line
    ]


# -- reading what is not the cell's --------------------------------------------------------


READ_PROBE = """
import json, os, sys
out = {}
for path in json.loads(sys.argv[1]):
    try:
        if os.path.isdir(path):
            out[path] = "listed " + ",".join(sorted(os.listdir(path)))
        else:
            with open(path, "rb") as f:
                out[path] = "read " + f.read(1 << 16).decode("latin-1")
    except OSError as exc:
        out[path] = f"error {exc.errno}"
print(json.dumps(out))
"""


def test_host_secret_files_are_not_readable(cell: Cell, tmp_path: Path) -> None:
    paths = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/etc/ssh",
        "/root",
        "/root/.ssh",
        "/root/.bash_history",
        *(f"/home/{name}" for name in sorted(os.listdir("/home")) if name != "user"),
        "/var",
        "/sys",
        "/proc/kcore",
        "/dev/core",
        "/proc/1/root/etc/shadow",
        "/proc/self/root/etc/shadow",
        "/etc/ssl/private",
        "/sys/fs/cgroup",
        "/dev/vda",
        "/dev/sda",
        "/dev/mem",
        "/dev/kmsg",
        "/dev/loop0",
        "/dev/loop-control",
        "/dev/mapper",
        str(tmp_path),
        str(Path(cell.info.workspace).parent),
    ]
    result = cell.py_json(READ_PROBE, json.dumps(paths))
    assert all(v.startswith("error ") for v in result.values()), result
    assert result["/etc/shadow"] == f"error {errno.ENOENT}"
    assert result["/root"] == f"error {errno.ENOENT}"
    r = cell.sh("cat /etc/shadow; ls -a /root")
    assert r["exit_code"] != 0 and r["stdout"] == ""
    # /home is the cell's own: E2B's name of the workspace (cellapi.layout), none of the host's.
    home = cell.sh("ls -A /home; stat -c %d:%i /home/user /workspace")["stdout"].split()
    assert home[0] == "user" and len(home) == 3 and home[1] == home[2], home
    # The cell's users are its own: none of the host's accounts.
    passwd = cell.run("cat /etc/passwd")["stdout"]
    assert {line.split(":")[0] for line in passwd.splitlines()} <= {"root", "sandbox", "nobody"}
    host_shadow = Path("/etc/shadow").read_text()
    assert host_shadow.splitlines()[0] not in json.dumps(result)


WALK_PROBE = """
import json, os, sys
name = sys.argv[1]
found, roots = [], ["/"]
# The whole tree, and every visible process's root and cwd.
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    roots += [f"/proc/{pid}/root", f"/proc/{pid}/cwd"]
for top in roots:
    for dirpath, dirnames, filenames in os.walk(top):
        inside = dirpath[len(top.rstrip("/")):]
        if inside in ("/proc", "/sys") or dirpath.count("/") > 12:
            dirnames[:] = []  # procfs is searched through the roots above, not from itself
        if name in filenames or name in dirnames:
            found.append(dirpath)
print(json.dumps({"found": found, "roots": len(roots)}))
"""


def test_another_cells_workspace_is_out_of_reach(
    cell: Cell, make_cell: Callable[..., Cell]
) -> None:
    other = make_cell()
    marker = f"marker-{secrets.token_hex(8)}"
    content = f"content-{secrets.token_hex(8)}"
    host_file = Path(cell.info.workspace) / marker
    host_file.write_text(content)
    try:
        assert cell.run(f"cat {marker}")["stdout"] == content  # A sees it where it belongs
        # B, by every path it could think of.
        ws_a, dir_a = cell.info.workspace, str(Path(cell.info.workspace).parent)
        direct = [
            f"{ws_a}/{marker}",
            ws_a,
            dir_a,
            f"/run/sandcell-stage/0/{marker}",
            "/run/sandcell-stage",
            f"/proc/1/root{ws_a}/{marker}",
            f"/proc/1/cwd/../../{Path(dir_a).name}/workspace/{marker}",
            f"/workspace/../{Path(dir_a).name}/workspace/{marker}",
            f"/proc/1/root/workspace/{marker}",
            f"/proc/2/root/workspace/{marker}",
            f"/proc/2/cwd/{marker}",
        ]
        result = other.py_json(READ_PROBE, json.dumps(direct))
        assert all(v.startswith("error ") for v in result.values()), result
        walked = other.py_json(WALK_PROBE, marker, timeout_s=60)
        assert walked["found"] == [] and walked["roots"] > 2
        r = other.sh(
            f"grep -rl -- {content} /workspace /tmp /dev/shm /run /opt /proc/*/root/workspace "
            "2>/dev/null; true"
        )
        assert content not in r["stdout"] and r["stdout"] == ""
        # Nor through B's daemon file API (its paths are confined to B's workspace).
        for path in (f"{ws_a}/{marker}", f"../{Path(dir_a).name}/workspace/{marker}"):
            response = other.client.signed_request("GET", "/v1/files", params={"path": path})
            assert response.status_code in (403, 404), response.text
            assert content not in response.text
        # A's daemon socket, by its host path, is not there for B either.
        uds = other.py_json(READ_PROBE, json.dumps([cell.info.uds]))
        assert uds == {cell.info.uds: f"error {errno.ENOENT}"}
        # Nor are A's processes: B cannot signal them by their host pids.
        a_pids = sorted(cell.host_pids())
        r = other.sh(" ; ".join(f"kill -9 {pid} 2>/dev/null && echo hit" for pid in a_pids))
        assert "hit" not in r["stdout"]
        assert cell.run("echo A fine")["stdout"] == "A fine\n"
        # And A and B do not even share a host uid.
        assert cell.info.uid != other.info.uid
    finally:
        host_file.unlink()


# -- writing where the cell must not ---------------------------------------------------------


WRITE_PROBE = """
import json, os, sys
out = {}
for kind, path in json.loads(sys.argv[1]):
    try:
        if kind == "create":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"pwned")
            os.close(fd)
        elif kind == "append":
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.write(fd, b"pwned")
            os.close(fd)
        elif kind == "mkdir":
            os.mkdir(path)
        elif kind == "unlink":
            os.unlink(path)
        elif kind == "symlink-write":  # a link from /tmp, written through
            link = f"/tmp/link-{os.getpid()}-{len(out)}"
            os.symlink(path, link)
            with open(link, "w") as f:
                f.write("pwned")
        elif kind == "rename-into":  # a file made in /tmp, moved out
            src = f"/tmp/mv-{os.getpid()}-{len(out)}"
            open(src, "w").close()
            os.rename(src, path)
        elif kind == "chmod":
            os.chmod(path, 0o777)
        out[f"{kind} {path}"] = "ok"
    except OSError as exc:
        out[f"{kind} {path}"] = exc.errno
print(json.dumps(out))
"""


def test_each_cell_has_a_boot_id_of_its_own(cell: Cell, make_cell: Callable[..., Cell]) -> None:
    """The kernel's boot id is one for the whole host: read alike in two cells, it would tell
    them they share one. Each cell reads its own, fixed for its life, and cannot change it."""
    path = "/proc/sys/kernel/random/boot_id"
    host = Path(path).read_text()
    ours = cell.run(["cat", path])["stdout"]
    theirs = make_cell().run(["cat", path])["stdout"]
    assert len({host, ours, theirs}) == 3, (host, ours, theirs)
    assert str(uuid.UUID(ours.strip())) == ours.strip()  # still the shape programs parse
    assert cell.run(["cat", path])["stdout"] == ours
    write = cell.sh(f"echo 00000000-0000-0000-0000-000000000000 > {path}")
    assert write["exit_code"] != 0 and cell.run(["cat", path])["stdout"] == ours


def test_writes_outside_workspace_and_tmp_are_refused(cell: Cell) -> None:
    tag = secrets.token_hex(6)
    attempts = [
        ("create", f"/probe-{tag}"),
        ("mkdir", f"/probe-dir-{tag}"),
        ("create", f"/etc/probe-{tag}"),
        ("append", "/etc/passwd"),
        ("append", "/etc/hosts"),
        ("create", f"/usr/probe-{tag}"),
        ("create", f"/usr/bin/probe-{tag}"),
        ("append", "/usr/bin/python3"),
        ("create", f"/opt/probe-{tag}"),
        ("create", f"/opt/sandcell/src/probe-{tag}"),
        ("append", "/opt/sandcell/src/sandcell/__init__.py"),
        ("create", f"/opt/sandcell/venv/probe-{tag}"),
        ("append", "/opt/sandcell/venv/pyvenv.cfg"),
        ("create", f"/run/sandcell/probe-{tag}"),
        ("unlink", "/run/sandcell/daemon.sock"),
        ("create", f"/run/probe-{tag}"),
        ("create", f"/dev/probe-{tag}"),
        ("unlink", "/dev/null"),
        ("append", "/proc/sysrq-trigger"),
        ("append", "/proc/sys/kernel/hostname"),
        ("append", "/proc/sys/vm/drop_caches"),
        ("append", "/proc/self/oom_score_adj"),
        ("create", f"/workspace/../probe2-{tag}"),
        ("symlink-write", f"/etc/probe3-{tag}"),
        ("symlink-write", f"/usr/probe3-{tag}"),
        ("rename-into", f"/etc/probe4-{tag}"),
        ("rename-into", f"/run/sandcell/probe4-{tag}"),
        ("chmod", "/etc/passwd"),
        ("chmod", "/usr/bin/python3"),
    ]
    result = cell.py_json(WRITE_PROBE, json.dumps(attempts))
    allowed = {k: v for k, v in result.items() if v == "ok"}
    assert allowed == {}, allowed
    # Landlock (EACCES), a read-only mount (EROFS) or permissions (EPERM); not "absent".
    assert result[f"create /usr/probe-{tag}"] in (errno.EROFS, errno.EACCES)
    # The daemon's socket is not in the cell at all: the host bound it and passed the fd.
    assert result["unlink /run/sandcell/daemon.sock"] == errno.ENOENT
    # Nothing of it reached the host.
    host_paths = [f"/usr/probe-{tag}", f"/usr/bin/probe-{tag}", f"/etc/probe3-{tag}"]
    assert not [p for p in host_paths if os.path.exists(p)]
    assert cell.run("echo still here")["stdout"] == "still here\n"


def test_workspace_tmp_devshm_and_devnull_are_writable(cell: Cell) -> None:
    tag = secrets.token_hex(4)
    attempts = [
        ("create", f"/workspace/w-{tag}"),
        ("mkdir", f"/workspace/d-{tag}"),
        ("create", f"/tmp/t-{tag}"),
        ("create", f"/dev/shm/s-{tag}"),
        ("append", "/dev/null"),
        ("symlink-write", f"/workspace/l-{tag}"),
    ]
    result = cell.py_json(WRITE_PROBE, json.dumps(attempts))
    assert set(result.values()) == {"ok"}, result
    r = cell.sh("echo x > /dev/null && echo ok; head -c 4 /dev/zero | wc -c")
    assert r["stdout"] == "ok\n4\n"
    assert (Path(cell.info.workspace) / f"w-{tag}").read_bytes() == b"pwned"
    cell.sh(f"rm -rf /workspace/w-{tag} /workspace/d-{tag} /workspace/l-{tag}")


# -- the network ---------------------------------------------------------------------------


CONNECT_PROBE = """
import json, socket, sys
out = {}
for label, family, addr in json.loads(sys.argv[1]):
    fam = {"inet": socket.AF_INET, "inet6": socket.AF_INET6, "unix": socket.AF_UNIX}[family]
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(tuple(addr) if family != "unix" else "\\0" + addr)
        s.sendall(b"escaped")
        out[label] = "connected"
    except OSError as exc:
        out[label] = exc.errno if exc.errno is not None else repr(exc)
    finally:
        s.close()
print(json.dumps(out))
"""


def host_address() -> str | None:
    """This host's own address on its default route, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # UDP: picks a route, sends nothing
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


@pytest.fixture
def host_listeners() -> Iterator[dict[str, socket.socket]]:
    """Listeners on the host: TCP on 127.0.0.1, TCP on every address, an abstract socket."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp_any = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp_any.bind(("0.0.0.0", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0sandcell-test-{secrets.token_hex(6)}")
    listeners = {"tcp": tcp, "tcp_any": tcp_any, "abstract": abstract}
    for s in listeners.values():
        s.listen(8)
        s.settimeout(0.3)
    yield listeners
    for s in listeners.values():
        s.close()


def _nobody_connected(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        return True
    conn.close()
    return False


def _escape_targets(listeners: dict[str, socket.socket]) -> list[list]:
    port = listeners["tcp"].getsockname()[1]
    any_port = listeners["tcp_any"].getsockname()[1]
    abstract = listeners["abstract"].getsockname()[1:].decode()  # the name without its NUL
    targets = [
        ["host-loopback", "inet", ["127.0.0.1", port]],
        ["host-localhost", "inet", ["localhost", port]],
        ["host-loopback-any", "inet", ["127.0.0.1", any_port]],
        ["host-ipv6-loopback", "inet6", ["::1", any_port]],
        ["host-abstract-unix", "unix", abstract],
        ["public-ip", "inet", ["1.1.1.1", 53]],
        ["link-local-metadata", "inet", ["169.254.169.254", 80]],
    ]
    if address := host_address():
        targets.append(["host-own-address", "inet", [address, any_port]])
    return targets


def _nobody_connected_anywhere(listeners: dict[str, socket.socket]) -> bool:
    return all(_nobody_connected(s) for s in listeners.values())


def test_no_connection_to_the_host_network(
    cell: Cell, host_listeners: dict[str, socket.socket]
) -> None:
    result = cell.py_json(CONNECT_PROBE, json.dumps(_escape_targets(host_listeners)))
    assert "connected" not in result.values(), result
    # network "none": Landlock refuses TCP connect outright (EACCES).
    assert result["host-loopback"] == errno.EACCES
    assert result["host-abstract-unix"] == errno.ECONNREFUSED  # another network namespace
    assert _nobody_connected_anywhere(host_listeners)
    interfaces = cell.run("cat /proc/net/dev")["stdout"]
    assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
    routes = cell.run("cat /proc/net/route")["stdout"].splitlines()
    assert routes[1:] == []  # no IPv4 route at all, hence no way out


TCP_INSIDE = """
import json, socket, threading
out = {}
try:
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    port = srv.getsockname()[1]
    def serve():
        conn, _ = srv.accept(); conn.sendall(conn.recv(16).upper()); conn.close()
    threading.Thread(target=serve, daemon=True).start()
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    c.sendall(b"ping"); out["echo"] = c.recv(16).decode()
except OSError as exc:
    out["error"] = exc.errno
try:
    c = socket.create_connection(("127.0.0.1", 1), timeout=5)
    out["connect_closed_port"] = "connected"
except OSError as exc:
    out["connect_closed_port"] = exc.errno
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
out["udp_bind"] = "ok"
print(json.dumps(out))
"""


def test_tcp_inside_the_cell_is_denied_when_network_is_none(cell: Cell) -> None:
    result = cell.py_json(TCP_INSIDE)
    assert result["error"] == errno.EACCES  # bind refused by Landlock
    assert result["connect_closed_port"] == errno.EACCES


def test_loopback_network_works_inside_but_not_to_the_host(
    make_cell: Callable[..., Cell], host_listeners: dict[str, socket.socket]
) -> None:
    loop = make_cell(CellPolicy(memory_mb=256, pids_max=64, disk_mb=64, network="loopback"))
    result = loop.py_json(TCP_INSIDE)
    assert result["echo"] == "PING"
    assert result["connect_closed_port"] == errno.ECONNREFUSED
    escape = loop.py_json(CONNECT_PROBE, json.dumps(_escape_targets(host_listeners)))
    assert "connected" not in escape.values(), escape
    assert escape["host-loopback"] == errno.ECONNREFUSED  # its own, empty, loopback
    assert escape["public-ip"] == errno.ENETUNREACH
    assert _nobody_connected_anywhere(host_listeners)


# -- the kernel's attack surface ---------------------------------------------------------------


# Families outside AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK: the hypervisor (vsock), raw
# frames (packet), and modules nobody's Python job needs. The last has garbage in the upper
# half, which the kernel ignores: so must the filter.
FOREIGN_FAMILIES = {"unspec": 0, "ax25": 3, "appletalk": 5, "x25": 9, "key": 15, "packet": 17,
                    "rds": 21, "can": 29, "tipc": 30, "bluetooth": 31, "alg": 38, "vsock": 40,
                    "xdp": 44, "mctp": 45, "vsock-high-bits": (1 << 32) | 40}  # fmt: skip
OWN_FAMILIES = {"unix": 1, "inet": 2, "inet6": 10, "netlink": 16}


def test_socket_families_beyond_unix_inet_netlink_are_unavailable(cell: Cell) -> None:
    calls = []
    for name, family in {**FOREIGN_FAMILIES, **OWN_FAMILIES}.items():
        for kind, sock_type in (("stream", 1), ("dgram", 2), ("raw", 3)):
            calls.append((f"socket {name} {kind}", nr("socket"), [family, sock_type, 0]))
        calls.append((f"socketpair {name}", nr("socketpair"), [family, 1, 0, "BUF"]))
    result = cell.py_json(SYSCALL_PROBE, json.dumps(calls))
    result = {k: v for k, v in result.items() if k.startswith("socket")}
    for name in FOREIGN_FAMILIES:
        outcomes = {v for k, v in result.items() if k.split()[1] == name}
        assert outcomes == {-errno.EAFNOSUPPORT}, (name, outcomes)
    for name in OWN_FAMILIES:  # each of the cell's own families opens a socket of some type
        assert any(v >= 0 for k, v in result.items() if k.startswith(f"socket {name} ")), name
    assert result["socketpair unix"] == 0


SYSCALL_PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def namespaces():
    return {n: os.readlink(f"/proc/self/ns/{n}") for n in sorted(os.listdir("/proc/self/ns"))}
before_ns, before_mounts = namespaces(), open("/proc/self/mounts").read()
buf = ctypes.create_string_buffer(4096)
os.makedirs("/tmp/mnt-probe", exist_ok=True)
fds = {n: os.open(f"/proc/self/ns/{n}", os.O_RDONLY) for n in ("net", "mnt", "user", "pid")}
out = {}
for label, nr, args in json.loads(sys.argv[1]):
    real = []
    for a in args:
        if a == "BUF":
            real.append(ctypes.c_long(ctypes.cast(buf, ctypes.c_void_p).value))
        elif isinstance(a, str) and a.startswith("FD:"):
            real.append(ctypes.c_long(fds[a[3:]]))
        elif isinstance(a, str) and a.startswith("STR:"):
            real.append(ctypes.c_char_p(a[4:].encode()))
        else:
            real.append(ctypes.c_long(a))
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *real)
    if ret == 0 and label.startswith("clone"):
        os._exit(0)  # a child would mean the namespace flag got through: the parent reports it
    out[label] = -ctypes.get_errno() if ret == -1 else ret
out["namespaces_unchanged"] = namespaces() == before_ns
out["mounts_unchanged"] = open("/proc/self/mounts").read() == before_mounts
print(json.dumps(out))
"""

EPERM = -errno.EPERM
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x20000, 0x40000000, 0x20000000
SIGCHLD = 17


def _denied_calls() -> list[tuple[str, int, list]]:
    """(label, number, arguments) of calls untrusted code must not get through."""
    return [
        ("ptrace_attach_1", nr("ptrace"), [16, 1, 0, 0]),  # PTRACE_ATTACH to pid 1
        ("ptrace_attach_daemon", nr("ptrace"), [16, 2, 0, 0]),
        ("ptrace_traceme", nr("ptrace"), [0, 0, 0, 0]),
        ("process_vm_readv", nr("process_vm_readv"), [2, "BUF", 1, "BUF", 1, 0]),
        ("mount_tmpfs", nr("mount"), ["STR:none", "STR:/tmp/mnt-probe", "STR:tmpfs", 0, 0]),
        ("mount_bind_root", nr("mount"), ["STR:/", "STR:/tmp/mnt-probe", 0, 0x1000, 0]),
        ("umount_proc", nr("umount2"), ["STR:/proc", 2]),  # MNT_DETACH
        ("pivot_root", nr("pivot_root"), ["STR:/tmp", "STR:/tmp/mnt-probe"]),
        ("fsopen", nr("fsopen"), ["STR:tmpfs", 0]),
        ("open_tree", nr("open_tree"), [-100, "STR:/", 1]),
        ("unshare_user", nr("unshare"), [CLONE_NEWUSER]),
        ("unshare_mount", nr("unshare"), [CLONE_NEWNS]),
        ("unshare_net", nr("unshare"), [CLONE_NEWNET]),
        ("setns_net", nr("setns"), ["FD:net", 0]),
        ("setns_mnt", nr("setns"), ["FD:mnt", 0]),
        ("setns_user", nr("setns"), ["FD:user", 0]),
        ("clone_newuser", nr("clone"), [CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0]),
        ("clone_newns", nr("clone"), [CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0]),
        ("clone_newpid", nr("clone"), [CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0]),
        ("init_module", nr("init_module"), ["BUF", 64, "STR:"]),
        ("finit_module", nr("finit_module"), [0, "STR:", 0]),
        ("delete_module", nr("delete_module"), ["STR:ext4", 0]),
        ("kexec_load", nr("kexec_load"), [0, 0, 0, 0]),
        ("io_uring_setup", nr("io_uring_setup"), [8, "BUF"]),
        ("io_uring_enter", nr("io_uring_enter"), [0, 0, 0, 0, 0, 0]),
        ("bpf_map_create", nr("bpf"), [0, "BUF", 72]),
        ("bpf_prog_load", nr("bpf"), [5, "BUF", 72]),
        ("perf_event_open", nr("perf_event_open"), ["BUF", 0, -1, -1, 0]),
        ("keyctl_get_keyring", nr("keyctl"), [0, -3, 0, 0, 0]),  # KEYCTL_GET_KEYRING_ID session
        ("add_key", nr("add_key"), ["STR:user", "STR:probe", "BUF", 4, -3]),
        ("request_key", nr("request_key"), ["STR:user", "STR:probe", 0, 0]),
        ("userfaultfd", nr("userfaultfd"), [0]),
        ("open_by_handle_at", nr("open_by_handle_at"), [-100, "BUF", 0]),
        ("name_to_handle_at", nr("name_to_handle_at"), [-100, "STR:/", "BUF", "BUF", 0]),
        ("reboot", nr("reboot"), [0xFEE1DEAD, 672274793, 0x4321FEDC, 0]),  # RESTART
        ("swapon", nr("swapon"), ["STR:/workspace/swap", 0]),
        ("acct", nr("acct"), ["STR:/tmp/acct"]),
        ("quotactl", nr("quotactl"), [0, "STR:/", 0, 0]),
        ("syslog", nr("syslog"), [3, "BUF", 4096]),  # SYSLOG_ACTION_READ_ALL
        ("settimeofday", nr("settimeofday"), ["BUF", 0]),
        ("clock_settime", nr("clock_settime"), [0, "BUF"]),
        ("ioctl_tiocsti", nr("ioctl"), [0, 0x5412, "BUF"]),
        ("personality_no_aslr", nr("personality"), [0x0040000]),
        ("pidfd_getfd", nr("pidfd_getfd"), [0, 0, 0]),
        ("kcmp", nr("kcmp"), [1, 2, 0, 0, 0]),
    ]


def test_dangerous_syscalls_fail_with_eperm_and_change_nothing(cell: Cell) -> None:
    calls = _denied_calls()
    result = cell.py_json(SYSCALL_PROBE, json.dumps(calls))
    wrong = {label: result[label] for label, _, _ in calls if result[label] != EPERM}
    assert wrong == {}, f"not refused with EPERM: {wrong}"
    assert result["namespaces_unchanged"] is True
    assert result["mounts_unchanged"] is True


def test_clone3_is_unavailable_and_threads_still_work(cell: Cell) -> None:
    result = cell.py_json(SYSCALL_PROBE, json.dumps([["clone3", nr("clone3"), ["BUF", 88]]]))
    assert result["clone3"] == -errno.ENOSYS
    r = cell.py(
        "import threading, subprocess; t = threading.Thread(target=print, args=('t',)); "
        "t.start(); t.join(); print(subprocess.run(['true']).returncode)"
    )
    assert r["stdout"] == "t\n0\n"


def test_namespace_tools_fail(cell: Cell) -> None:
    for command in (
        "unshare -U true",
        "unshare -r id",
        "unshare -m true",
        "unshare -n true",
        "unshare -p -f true",
        "nsenter -t 1 -m true",
        "mount -t tmpfs none /tmp",
        "umount /proc",
        "hostname escaped",
        "mknod /tmp/sda b 8 0",
        "mknod /workspace/mem c 1 1",
    ):
        r = cell.run(command)
        assert r["exit_code"] != 0, (command, r)


def test_setuid_binaries_and_setuid_calls_give_no_root(cell: Cell) -> None:
    setuid = cell.run("find /usr -perm -4000 -type f")["stdout"].split()
    for binary in setuid:
        r = cell.run([binary, "--version"], timeout_s=10)
        assert r["exit_code"] in range(256), r  # ran, as whoever it could
    r = cell.sh("echo root | su -c 'id -u' root; echo; id -u", stdin="root\n")
    assert r["stdout"].split()[-1] == "1000" and "\n0\n" not in r["stdout"], r
    code = """
    import json, os
    out = {}
    for name, call in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                       ("setgroups", lambda: os.setgroups([0])),
                       ("chown", lambda: os.chown("/workspace", 0, 0))):
        try:
            call(); out[name] = "ok"
        except OSError as exc:
            out[name] = exc.errno
    out["uid"] = os.getuid()
    print(json.dumps(out))
    """
    result = cell.py_json(code)
    assert result.pop("uid") == 1000
    # EINVAL: uid 0 does not even exist in the cell's user namespace (only 1000 is mapped).
    assert all(v in (errno.EPERM, errno.EINVAL) for v in result.values()), result


def test_ptrace_of_a_sibling_fails(cell: Cell) -> None:
    """The same uid, a child of our own: ptrace still refused, nothing gets traced."""
    code = """
    import ctypes, json, os, subprocess, time
    libc = ctypes.CDLL(None, use_errno=True)
    child = subprocess.Popen(["sleep", "5"])
    ret = libc.ptrace(16, child.pid, 0, 0)  # PTRACE_ATTACH
    err = ctypes.get_errno()
    time.sleep(0.05)
    tracer = [l for l in open(f"/proc/{child.pid}/status") if l.startswith("TracerPid")][0]
    child.kill()
    print(json.dumps({"ret": ret, "errno": err, "tracer": tracer.split()[1]}))
    """
    result = cell.py_json(code)
    assert result == {"ret": -1, "errno": errno.EPERM, "tracer": "0"}
    # Nor can the daemon's memory be read by the same uid.
    r = cell.sh("cat /proc/2/mem 2>&1 | head -c 100; cat /proc/2/environ 2>&1 | head -c 100")
    assert "Permission denied" in r["stdout"]


# Machine code for the other ABIs of x86-64: `mov eax, 20; int 0x80; ret` (i386 getpid).
INT80 = """
import ctypes, mmap
code = bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3])
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print("returned", ctypes.CFUNCTYPE(ctypes.c_long)(addr)())
"""
X32 = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("returned", libc.syscall(39 | 0x40000000))  # x32 getpid
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 foreign ABIs")
@pytest.mark.parametrize("code", [INT80, X32], ids=["i386-int80", "x32"])
def test_foreign_arch_syscalls_kill_the_process(cell: Cell, code: str) -> None:
    r = cell.py(code)
    assert "returned" not in r["stdout"]
    assert r["signal"] == SIGSYS and r["exit_code"] == 128 + SIGSYS, r


# -- other processes -----------------------------------------------------------------------


def test_host_process_cannot_be_killed(cell: Cell, host_sleeper: subprocess.Popen[bytes]) -> None:
    pid = host_sleeper.pid
    r = cell.run(f"kill -9 {pid}")
    assert r["exit_code"] != 0, r
    code = f"""
    import ctypes, json, os
    out = {{"visible": os.path.exists("/proc/{pid}/cmdline") and
            b"sleep" in open("/proc/{pid}/cmdline", "rb").read()}}
    for sig in (9, 0):
        try:
            os.kill({pid}, sig); out[f"kill{{sig}}"] = "ok"
        except OSError as exc:
            out[f"kill{{sig}}"] = exc.errno
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall({nr("pidfd_open")}, {pid}, 0)
    out["pidfd_open"] = fd if fd >= 0 else -ctypes.get_errno()
    print(json.dumps(out))
    """
    result = cell.py_json(code)
    assert result == {
        "visible": False,
        "kill9": errno.ESRCH,
        "kill0": errno.ESRCH,
        "pidfd_open": -errno.ESRCH,
    }
    assert host_sleeper.poll() is None  # alive and well


def test_kill_everything_inside_harms_nothing_outside(
    cell: Cell, make_cell: Callable[..., Cell], host_sleeper: subprocess.Popen[bytes]
) -> None:
    victim = make_cell()
    try:
        r = victim.run("kill -9 -1; sleep 1; echo survived", timeout_s=10)
        outcome = f"answered {r}"
    except httpx.HTTPError as exc:  # the daemon was among the killed: the cell is over
        outcome = f"connection lost: {exc!r}"
    assert host_sleeper.poll() is None, outcome
    assert cell.run("echo other cell fine")["stdout"] == "other cell fine\n"
    if not victim.owner.cells.alive(victim.info):
        assert wait_until(lambda: not victim.host_pids(), 5), victim.host_pids()
    victim.destroy()  # and the module's teardown checks that nothing of it is left


# -- identity ------------------------------------------------------------------------------


def test_files_and_processes_never_hold_host_root(cell: Cell) -> None:
    r = cell.sh("touch owned && mkdir -p owned-dir && id -u && id -g && cat /proc/self/uid_map")
    assert r["exit_code"] == 0, r
    uid_inside, gid_inside, uid_map = r["stdout"].splitlines()
    assert (uid_inside, gid_inside) == ("1000", "1000")
    assert uid_map.split()[::2] == ["1000", "1"]  # one uid mapped: no root inside either
    for name in ("owned", "owned-dir"):
        st = (Path(cell.info.workspace) / name).stat()
        assert st.st_uid == cell.info.uid and st.st_gid == cell.info.uid
        assert st.st_uid != 0 and st.st_uid in CELL_UIDS
    cell.run("rm -rf owned owned-dir")
    cell.run("sleep 20 >/dev/null 2>&1 &")  # a command's process, not only the daemon
    pids = cell.host_pids()
    assert len(pids) >= 3
    for pid in pids:
        ids = status_ids(pid)
        if not ids:
            continue  # exited meanwhile
        assert 0 not in ids["Uid"] and 0 not in ids["Gid"], (pid, ids, read_proc(pid, "cmdline"))
        assert set(ids["Uid"]) == {cell.info.uid}, (pid, ids)
        groups = [
            line for line in read_proc(pid, "status").decode().splitlines() if "Groups" in line
        ]
        assert groups[0].split(":")[1].split() in ([], [str(cell.info.uid)])
        cap_eff = [
            line for line in read_proc(pid, "status").decode().splitlines() if "CapEff" in line
        ]
        assert int(cap_eff[0].split()[1], 16) == 0, (pid, read_proc(pid, "cmdline"))


def test_seccomp_no_new_privs_and_no_capabilities_inside(cell: Cell) -> None:
    status = dict(
        line.split(":\t", 1) for line in cell.run("cat /proc/self/status")["stdout"].splitlines()
    )
    assert status["Seccomp"].strip() == "2"
    assert status["NoNewPrivs"].strip() == "1"
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    # The daemon itself too (every command inherits from it).
    daemon = dict(
        line.split(":\t", 1) for line in cell.run("cat /proc/2/status")["stdout"].splitlines()
    )
    assert "sandcell" in cell.run("cat /proc/2/cmdline")["stdout"]
    assert daemon["Seccomp"].strip() == "2" and daemon["NoNewPrivs"].strip() == "1"
    assert int(daemon["CapEff"], 16) == 0
