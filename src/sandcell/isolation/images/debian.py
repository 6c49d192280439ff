"""A Debian root from the Debian archive, made by mmdebstrap (SPEC §12, `debian:<suite>`).

mmdebstrap needs many uids (packages own files as root, _apt, man...) and chroot, so this
step does not run in the single-uid bwrap cell: it runs in a user namespace mapping a range
of 65536 host ids (root's subordinate range from /etc/subuid if it has one), where uid 0 is
an unprivileged host uid. mmdebstrap there takes the unshare mode's
root path: a private mount namespace, apt and dpkg inside the chroot, the archive over the
host's network.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sandcell.isolation.bwrap import Bind
from sandcell.isolation.images.buildcell import ID_RANGE, Step
from sandcell.isolation.images.spec import ImageSpec

MIRROR = "http://deb.debian.org/debian"
SUBID_FILES = ("/etc/subuid", "/etc/subgid")
# Far above the cells' uids (200000-209999) and the build uid.
DEFAULT_BASE = 2_000_000


def bootstrap(spec: ImageSpec, staging: Path, base: int) -> Step:
    """The mmdebstrap run for the spec's suite and apt packages (plus pip when pip steps
    follow), into staging/rootfs; `base` is the host uid that is root inside."""
    tmp = staging / "tmp"
    tmp.mkdir(mode=0o700)
    if os.geteuid() == 0:
        for path in (staging, staging / "rootfs", tmp):
            os.chown(path, base, base)
    packages = list(spec.apt) + (["python3-pip"] if spec.pip else [])
    command = ["mmdebstrap", "--mode=unshare", "--variant=minbase", "--format=directory"]
    command.append("--skip=output/dev")  # device nodes: cells get a /dev of their own
    if packages:
        command.append(f"--include={','.join(packages)}")
    command += [spec.suite, "{0}/rootfs", MIRROR]
    return Step(
        command,
        [Bind(str(staging), "")],
        env={"TMPDIR": "{0}/tmp", "HOME": "{0}/tmp"},
        userns_base=base,
    )


def finish(staging: Path, owner: int) -> None:
    """Hands the root to the build uid (the next steps run as it) and drops the scratch."""
    shutil.rmtree(staging / "tmp", ignore_errors=True)
    if os.geteuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(staging / "rootfs"):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), owner, owner)
    for path in (staging, staging / "rootfs"):
        os.chown(path, owner, owner)


def id_base() -> int:
    """The first host id of the build's range: root's subordinate range when /etc/subuid
    and /etc/subgid give it one (the administrator's choice), else DEFAULT_BASE."""
    starts = {_range_for_root(Path(path)) for path in SUBID_FILES}
    return starts.pop() if len(starts) == 1 and None not in starts else DEFAULT_BASE  # type: ignore[return-value]


def _range_for_root(path: Path) -> int | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        owner, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        valid = start.isdigit() and count.isdigit() and int(count or 0) >= ID_RANGE
        if owner in ("root", "0") and valid:
            return int(start)
    return None
