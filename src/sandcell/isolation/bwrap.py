"""The bubblewrap command line of a cell: namespaces, a read-only system, private writables."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CELL_UID = 1000
CELL_HOSTNAME = "sandcell"
CELL_WORKSPACE = "/workspace"

SYSTEM_DIRS = ("/usr",)
# Merged-/usr systems have these as symlinks into /usr; bwrap recreates them.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The few files of /etc that programs need; nothing with keys, hosts' users or credentials.
ETC_ENTRIES = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "os-release",
    "debian_version",
    "mime.types",
    "protocols",
    "services",
    "ssl/openssl.cnf",
    "ssl/certs",
    "ca-certificates",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "bash.bashrc",
    "profile",
    "inputrc",
    "magic",
    "gai.conf",
    "host.conf",
    "timezone",
)


@dataclass(frozen=True)
class Bind:
    source: str
    dest: str
    writable: bool = False


def _etc_binds(existing: Iterable[str]) -> list[str]:
    args: list[str] = []
    for entry in existing:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    return args


def host_system(links: dict[str, str]) -> list[str]:
    """The host's system dirs as the cell's read-only root; `links` maps /bin-style paths to
    their targets. (An image template's root comes from `images.stage.root_args`.)"""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        args += ["--ro-bind", path, path]
    for path, target in links.items():
        args += ["--symlink", target, path]
    return args + _etc_binds(ETC_ENTRIES)


def build_argv(
    *,
    binds: Iterable[Bind],
    system: list[str],
    etc_data: dict[str, int],
    env: dict[str, str],
    seccomp_fd: int | None,
    scratch: tuple[int, int],
    command: list[str],
    chdir: str,
) -> list[str]:
    """`system` builds the read-only root (`host_system` or an image's); `etc_data` maps
    generated files (passwd, group, hosts) to the fds bwrap reads them from (no host file
    to name); `env` is the daemon's complete environment; `scratch` is the size in bytes of
    /tmp and /dev/shm."""
    argv = [
        "bwrap",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--unshare-net",
        "--disable-userns",
        "--assert-userns-disabled",
        "--uid",
        str(CELL_UID),
        "--gid",
        str(CELL_UID),
        "--hostname",
        CELL_HOSTNAME,
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv += system
    for dest, fd in etc_data.items():
        argv += ["--perms", "0644", "--ro-bind-data", str(fd), dest]
    tmp_bytes, shm_bytes = scratch
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(shm_bytes), "--perms", "1777", "--tmpfs", "/dev/shm"]  # noqa: S108
    argv += ["--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108
    for bind in binds:
        argv += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--remount-ro", "/", "--chdir", chdir, "--", *command]
    return argv
