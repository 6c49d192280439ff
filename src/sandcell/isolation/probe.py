"""What this host can enforce, layer by layer (`sandcell doctor`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandcell.isolation import cgroups, disk, landlock, seccomp


@dataclass(frozen=True)
class LayerReport:
    layer: str
    available: bool
    detail: str


def _run(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def _namespaces() -> LayerReport:
    if shutil.which("bwrap") is None:
        return LayerReport(
            "namespaces", False, "bubblewrap is not installed (apt install bubblewrap)"
        )
    _, version = _run(["bwrap", "--version"])
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [
        *(drop if os.geteuid() == 0 else []),
        "bwrap",
        "--unshare-all",
        "--uid",
        "1000",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--proc",
        "/proc",
        "true",
    ]
    ok, out = _run(argv)
    detail = f"{version}; user, pid, mount, ipc, uts, cgroup, net as an unprivileged uid"
    return LayerReport("namespaces", ok, detail if ok else f"{version}: {out}")


def _seccomp() -> LayerReport:
    status = Path("/proc/self/status").read_text()
    if "Seccomp:" not in status:
        return LayerReport("seccomp", False, "kernel without seccomp")
    try:
        program = seccomp.build_filter()
    except Exception as exc:
        return LayerReport("seccomp", False, f"libseccomp: {exc}")
    return LayerReport(
        "seccomp",
        True,
        f"libseccomp filter, {len(program) // 8} instructions,"
        f" {len(seccomp.DENIED_SYSCALLS)} syscalls denied, sockets unix/inet/inet6/netlink only",
    )


def _landlock() -> LayerReport:
    """Cells need writes confined and signal scoping (ABI 6): commands share the daemon's uid,
    and only a scoped domain keeps them from signalling it."""
    ok, detail = landlock.cell_support()
    if not ok:
        return LayerReport("landlock", False, detail)
    return LayerReport(
        "landlock",
        True,
        f"{detail}: write confinement; signal scoping (commands cannot signal the daemon);"
        " TCP bind/connect denial (network none)",
    )


def _cgroups() -> LayerReport:
    try:
        return LayerReport("cgroups", True, cgroups.detect().describe())
    except cgroups.CgroupUnavailable as exc:
        return LayerReport("cgroups", False, str(exc))


def _disk() -> LayerReport:
    ok, detail = disk.loop_quota_available()
    return LayerReport("disk_quota", ok, detail)


def _identity() -> LayerReport:
    if os.geteuid() != 0:
        return LayerReport("identity", True, f"cells run as this uid ({os.geteuid()})")
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        return LayerReport("identity", False, "setpriv/unshare missing (util-linux)")
    if "\toverlay" not in Path("/proc/filesystems").read_text():
        return LayerReport("identity", False, "no overlayfs: cells stage their mounts on it")
    return LayerReport(
        "identity",
        True,
        "per-cell unprivileged host uid (setpriv, unshare); mounts staged on overlayfs",
    )


def probe_host() -> list[LayerReport]:
    reports = [_namespaces(), _identity(), _seccomp(), _landlock(), _cgroups(), _disk()]
    reports.append(LayerReport("rlimits", True, "core 0, nofile, fsize = disk quota"))
    return reports
