"""A Debian root from the Debian archive, made by mmdebstrap (SPEC §12, `debian:<suite>`).

mmdebstrap needs many uids (packages own files as root, _apt, man...) and chroot, so this
step does not run in the single-uid bwrap cell: it runs in a user namespace mapping root's
subordinate range (/etc/subuid and /etc/subgid, as mmdebstrap's own unprivileged mode
does), where uid 0 is an unprivileged host uid. mmdebstrap there takes the unshare mode's
root path: a private mount namespace, apt and dpkg inside the chroot, the archive over the
host's network.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sandcell.isolation.images.buildcell import Step
from sandcell.isolation.images.spec import ImageSpec

MIRROR = "http://deb.debian.org/debian"
RANGE = 65536
SUBID_FILES = ("/etc/subuid", "/etc/subgid")


class NoSubordinateIds(Exception):
    pass


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
    command += ["--skip=output/dev", "--skip=cleanup/apt/lists"]
    if packages:
        command.append(f"--include={','.join(packages)}")
    command += [spec.suite, str(staging / "rootfs"), MIRROR]
    return Step(command, env={"TMPDIR": str(tmp)}, userns_base=base)


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


def subordinate_base() -> int:
    """The first id of a range of at least RANGE that root owns in both subid files."""
    starts = []
    for path in SUBID_FILES:
        starts.append(_range_for_root(Path(path)))
    if starts[0] is None or starts[0] != starts[1]:
        raise NoSubordinateIds(
            f"debian bases need one range of {RANGE} subordinate ids for root, the same in "
            f"{' and '.join(SUBID_FILES)} (e.g. `usermod --add-subuids 1000000-1065535 "
            "--add-subgids 1000000-1065535 root`)"
        )
    return starts[0]


def _range_for_root(path: Path) -> int | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        owner, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        valid = start.isdigit() and count.isdigit() and int(count or 0) >= RANGE
        if owner in ("root", "0") and valid:
            return int(start)
    return None
