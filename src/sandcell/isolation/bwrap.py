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
    "fonts",  # fontconfig: without it every first plot prints "Cannot load default config file"
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


@dataclass(frozen=True)
class OwnFilesystems:
    """bwrap's arguments for what the cell has of its own: its root, the generated /etc
    files, /proc, /dev, /dev/shm and /tmp. `root` comes first (the system is bound onto
    it), `rest` after the system."""

    root: list[str]
    rest: list[str]


def bwrap_made(
    etc_data: dict[str, int], scratch: tuple[int, int], proc_data: dict[str, int]
) -> OwnFilesystems:
    """The cell's own filesystems as bwrap makes them itself, for an unprivileged launch (no
    stage to make them on): tmpfs mounted from inside the cell's user namespace, which the
    kernel shows with their owner's host uid (`uid=N`, the caller's own uid here). `etc_data`
    maps generated files to the fds bwrap reads them from, `proc_data` the same for files
    over the cell's /proc; `scratch` is the size in bytes of /tmp and /dev/shm. A root launch
    stages them instead (staging.own_filesystems)."""
    rest: list[str] = []
    for dest, fd in etc_data.items():
        rest += ["--perms", "0644", "--ro-bind-data", str(fd), dest]
    tmp_bytes, shm_bytes = scratch
    rest += ["--proc", "/proc"]
    for dest, fd in proc_data.items():
        rest += ["--perms", "0444", "--ro-bind-data", str(fd), dest]
    rest += ["--dev", "/dev"]
    rest += ["--size", str(shm_bytes), "--perms", "1777", "--tmpfs", "/dev/shm"]  # noqa: S108
    rest += ["--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108
    return OwnFilesystems([], rest)


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
    own: OwnFilesystems,
    binds: Iterable[Bind],
    system: list[str],
    env: dict[str, str],
    seccomp_fd: int | None,
    command: list[str],
    chdir: str,
) -> list[str]:
    """`own` makes the cell's own places (`bwrap_made` or a staged root's); `system` builds
    the read-only system on it (`host_system` or an image's); `env` is the daemon's complete
    environment."""
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
    argv += [*own.root, *system, *own.rest]
    for bind in binds:
        argv += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--remount-ro", "/", "--chdir", chdir, "--", *command]
    return argv
