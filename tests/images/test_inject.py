"""The daemon's runtime copied for pods of any image (Kubernetes, SPEC §12): it runs from
wherever it is mounted, in a root with no Python and no glibc of its own, and ignores the
image's PYTHON* variables."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandcell.isolation.images.inject import RUNTIME_MOUNT, daemon_command, inject
from sandcell.isolation.images.oci import unpack
from sandcell.isolation.images.stage import root_args
from support import oci

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.slow,
]


def test_the_injected_runtime_runs_the_daemon_in_a_busybox_root(tmp_path: Path) -> None:
    rootfs, runtime = tmp_path / "rootfs", tmp_path / "runtime"
    rootfs.mkdir()
    unpack(oci.write_archive(tmp_path / "bb.tar", [oci.busybox_rootfs()]), rootfs)
    inject(runtime)
    probe = "import sys, ssl, sqlite3, sandcell.daemon.server; print(sys.flags.isolated, sys.path)"
    argv = ["bwrap", "--unshare-all", *root_args(str(rootfs))]
    argv += ["--ro-bind", str(runtime), RUNTIME_MOUNT, "--proc", "/proc", "--dev", "/dev"]
    argv += ["--setenv", "PYTHONPATH", "/nowhere", "--"]
    out = subprocess.run(
        [*argv, *daemon_command(), "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    isolated, path = out.stdout.split(" ", 1)
    assert isolated == "1" and "/nowhere" not in path and path.count(RUNTIME_MOUNT) == 3
    assert not (rootfs / "usr/lib/python3").exists()  # nothing of Python came from the image
