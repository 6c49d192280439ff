"""The seccomp filter, loaded by a real bwrap and probed from inside the cell."""

import json
import os
import subprocess
import textwrap

import pyseccomp

from sandcell.isolation.seccomp import DENIED_SYSCALLS, build_filter

BWRAP = [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64",
    "--symlink", "usr/bin", "/bin",
    "--proc", "/proc",
    "--dev", "/dev",
]  # fmt: skip

EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
AF_PACKET, AF_VSOCK = 17, 40
SOCK_STREAM, SOCK_RAW = 1, 3
SIGSYS = 31
CLONE_THREAD = 0x10000  # without CLONE_SIGHAND: EINVAL, so an unfiltered probe creates nothing
TIOCSTI = 0x5412


def run_cell(script: str, *args: str, seccomp: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python3 -c script`` in a bwrap cell, with the filter passed through a memfd.

    bwrap reads the program from the fd's shared offset, so each launch needs a fresh fd.
    """
    fd = os.memfd_create("sandcell-seccomp")
    try:
        os.write(fd, build_filter())
        os.lseek(fd, 0, os.SEEK_SET)
        cmd = [*BWRAP, *(["--seccomp", str(fd)] if seccomp else [])]
        cmd += ["/usr/bin/python3", "-c", textwrap.dedent(script), *args]
        return subprocess.run(
            cmd, pass_fds=(fd,), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(fd)


PROBE = """
    import ctypes, json, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out = {}
    for label, nr, args in json.loads(sys.argv[1]):
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
        out[label] = -ctypes.get_errno() if ret == -1 else ret
    print(json.dumps(out))
"""


def nr(name: str) -> int:
    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


# label -> (syscall, args, result under the filter: -errno or a return value). The arguments
# are chosen so that, without the filter, the kernel answers something else (checked below).
PROBES: dict[str, tuple[str, list[int], int]] = {
    "ptrace": ("ptrace", [0x4206, 0x3FFFFFFF, 0, 0], -EPERM),  # PTRACE_SEIZE, no such pid
    "process_vm_readv": ("process_vm_readv", [0x3FFFFFFF, 0, 0, 0, 0, 0], -EPERM),
    "mount": ("mount", [0, 0, 0, 0, 0], -EPERM),
    "setns": ("setns", [-1, 0], -EPERM),
    "bpf": ("bpf", [0, 0, 0], -EPERM),
    "perf_event_open": ("perf_event_open", [0, 0, -1, -1, 0], -EPERM),
    "keyctl": ("keyctl", [9999, 0, 0, 0, 0], -EPERM),
    "io_uring_setup": ("io_uring_setup", [1, 0], -EPERM),
    "userfaultfd": ("userfaultfd", [0xFFFF], -EPERM),
    "init_module": ("init_module", [0, 0, 0], -EPERM),
    "open_by_handle_at": ("open_by_handle_at", [-1, 0, 0], -EPERM),
    "clone NEWNS": ("clone", [0x00020000 | CLONE_THREAD, 0, 0, 0, 0], -EPERM),
    "clone NEWUSER": ("clone", [0x10000000 | CLONE_THREAD, 0, 0, 0, 0], -EPERM),
    "clone NEWPID": ("clone", [0x20000000 | CLONE_THREAD, 0, 0, 0, 0], -EPERM),
    "clone NEWNET": ("clone", [0x40000000 | CLONE_THREAD, 0, 0, 0, 0], -EPERM),
    "clone3": ("clone3", [0, 0], -ENOSYS),
    "ioctl TIOCSTI": ("ioctl", [0, TIOCSTI, 0], -EPERM),
    "ioctl TIOCSTI high bits": ("ioctl", [0, (1 << 32) | TIOCSTI, 0], -EPERM),
    "personality NO_RANDOMIZE": ("personality", [0x0040000], -EPERM),
    "personality high bits": ("personality", [(1 << 32) | 0x0400000], -EPERM),
    "personality query": ("personality", [0xFFFFFFFF], 0),
    # Unfiltered, vsock works on a VM host and packet sockets need CAP_NET_RAW (EPERM).
    "socket AF_VSOCK": ("socket", [AF_VSOCK, SOCK_STREAM, 0], -EAFNOSUPPORT),
    "socket AF_VSOCK high bits": ("socket", [(1 << 32) | AF_VSOCK, SOCK_STREAM, 0], -EAFNOSUPPORT),
    "socket AF_PACKET": ("socket", [AF_PACKET, SOCK_RAW, 0], -EAFNOSUPPORT),
    "socketpair AF_VSOCK": ("socketpair", [AF_VSOCK, SOCK_STREAM, 0, 0], -EAFNOSUPPORT),
    "unshare NEWUSER": ("unshare", [0x10000000], -EPERM),  # last: unfiltered, it succeeds
}
# Allowed with or without the filter: the probe shows the query still works.
SAME_WITHOUT_FILTER = {"personality query"}
# Without the filter these say EAFNOSUPPORT too on a host without vsock (not a VM).
VSOCK_PROBES = {"socket AF_VSOCK", "socket AF_VSOCK high bits", "socketpair AF_VSOCK"}


def probe(seccomp: bool) -> dict[str, int]:
    table = [[label, nr(name), args] for label, (name, args, _) in PROBES.items()]
    proc = run_cell(PROBE, json.dumps(table), seccomp=seccomp)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_denied_syscalls_fail_with_the_expected_errno() -> None:
    filtered, unfiltered = probe(seccomp=True), probe(seccomp=False)
    assert filtered == {label: expected for label, (_, _, expected) in PROBES.items()}
    for label, result in filtered.items():
        host_lacks_it = label in VSOCK_PROBES and unfiltered[label] == -EAFNOSUPPORT
        if label not in SAME_WITHOUT_FILTER and not host_lacks_it:
            assert unfiltered[label] != result, f"{label}: the probe does not test the filter"


FOREIGN_ABI = """
    import ctypes, mmap, subprocess, sys
    X32 = '''
    import ctypes
    ret = ctypes.CDLL(None, use_errno=True).syscall(0x40000000 | 39)  # x32 getpid
    print("ENOSYS" if ret == -1 and ctypes.get_errno() == 38 else ret)
    '''
    I386 = '''
    import ctypes, mmap, os
    code = bytes.fromhex("b814000000cd80c3")  # mov eax, 20 (getpid on i386); int 0x80; ret
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    getpid = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    print(getpid() == os.getpid())
    '''
    for code in (X32, I386):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        print(f"{proc.returncode}:{proc.stdout.strip()}")
"""


def test_x32_and_i386_syscalls_kill_the_process() -> None:
    unfiltered = run_cell(FOREIGN_ABI, seccomp=False)
    # Without the filter: this kernel has no x32 ABI (ENOSYS) but does run int 0x80 syscalls.
    assert unfiltered.stdout.split() == ["0:ENOSYS", "0:True"], unfiltered.stderr
    filtered = run_cell(FOREIGN_ABI)
    assert filtered.stdout.split() == [f"{-SIGSYS}:", f"{-SIGSYS}:"], filtered.stderr


def test_ordinary_work_still_runs() -> None:
    script = """
        import concurrent.futures, os, socket, subprocess, threading
        assert subprocess.run(["/bin/sh", "-c", "echo $((6 * 7))"], capture_output=True,
                              text=True, check=True).stdout == "42\\n"
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/sh", ["sh", "-c", "exit 3"])
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert sorted(pool.map(lambda n: n * n, range(8))) == [n * n for n in range(8)]
        with socket.create_server(("127.0.0.1", 0)) as server:
            def echo():
                conn, _ = server.accept()
                with conn:
                    conn.sendall(conn.recv(16))
            thread = threading.Thread(target=echo)
            thread.start()
            with socket.create_connection(server.getsockname()) as client:
                client.sendall(b"ping")
                assert client.recv(16) == b"ping"
            thread.join()
        print("ok")
    """
    proc = run_cell(script)
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr


def test_no_new_privs_is_set_inside() -> None:
    proc = run_cell("print(open('/proc/self/status').read())")
    assert "NoNewPrivs:\t1" in proc.stdout, proc.stderr


SPEC_DENIED = [
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "unshare",
    "setns", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "swapon",
    "swapoff", "reboot", "acct", "quotactl",
]  # fmt: skip


def test_deny_list_covers_the_spec_and_every_name_is_in_the_filter() -> None:
    assert set(SPEC_DENIED) <= set(DENIED_SYSCALLS)
    assert all(nr(name) >= 0 for name in SPEC_DENIED)  # none of them silently skipped here


def test_filter_is_built_once() -> None:
    assert build_filter() is build_filter()
