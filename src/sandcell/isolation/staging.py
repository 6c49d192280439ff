"""What a cell's filesystem is made of, and the stage that keeps the host's names out of it.

A cell's / is either the host's system dirs or a built image (SPEC §12), with the daemon's
runtime, the workspace and the cell's own places (/tmp, /dev, /dev/shm, /proc, the generated
/etc files) on it. `CellRoot` is the one place where the two kinds of root differ.

As root, the launcher (isolation/launch.py) first builds a stage: a tmpfs of the cell's private
mount namespace where every host directory the cell sees is mounted under a neutral name, so
that the cell's mount table (``/proc/self/mountinfo`` shows each mount's root within its
filesystem, and its options) names nothing of the host (SPEC §3):

- a read-only source (the venv, the code) is shown through a read-only overlay whose lower
  layers are stage paths: the overlay's root is ``/`` and its options name the stage only;
- a writable source (the workspace) cannot be an overlay (no upper layer): it is bound as is,
  which is neutral when it is the root of its own filesystem (the loop-mounted disk image);
- the cell's own filesystems are mounted there by root, not by bwrap from inside the cell's
  user namespace: the kernel prints a tmpfs's owner as the host sees it (`uid=200003`), and
  one that root mounts has none to print.

The stage dies with the private mount namespace, that is with the cell's last process.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.cellapi.layout import WORKSPACE_ALIASES
from sandcell.isolation.bwrap import (
    CELL_UID,
    CELL_WORKSPACE,
    SYSTEM_LINKS,
    Bind,
    OwnFilesystems,
    host_system,
)
from sandcell.isolation.images import stage as image_stage
from sandcell.isolation.images.trust import image_trust
from sandcell.isolation.policy import CellPolicy
from sandcell.isolation.runtime import CELL_SRC, cell_python, runtime_mounts

# sandcell's own commands for cells (a `sudo` that says why there is none, E2B's `python`),
# in the package as its sources are bound into the cell, and where they go on the cell's PATH.
CELL_BIN = "sandcell/isolation/cellbin"
CELL_BIN_DIR = "/usr/local/bin"

STAGE = "/run/sandcell-stage"
CELL_CA_DIR = "/run/sandcell/tls"  # where a sandbox with secrets finds its CA bundle
_EMPTY_LAYER = f"{STAGE}/empty"  # overlayfs wants two lower layers when it has no upper one
_OWN_ROOT = f"{STAGE}/root"
# What bwrap's --dev makes, made here instead: the host's harmless nodes, bound; the links.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "fd": "/proc/self/fd",
    "core": "/proc/kcore",
    "ptmx": "pts/ptmx",
}

# passwd/group/hosts of the cell's own (the host's users are none of its business): written
# on the stage, or handed to bwrap as memfds: no host file to name in the cell's mount table.
ETC_FILES = {
    "passwd": f"root:x:0:0::/:/usr/sbin/nologin\n"
    f"sandbox:x:{CELL_UID}:{CELL_UID}::{CELL_WORKSPACE}:/bin/sh\n"
    "nobody:x:65534:65534::/:/usr/sbin/nologin\n",
    "group": f"root:x:0:\nsandbox:x:{CELL_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandcell\n::1 localhost ip6-localhost\n",
    "hostname": "sandcell\n",
}

# The kernel's boot id, which every process on the host reads alike: a cell gets one of its
# own at each start, so two cells cannot tell they share a host by it, and a sandbox resumed
# into a new cell reads a new one, as after a reboot (E2B's code checks for one so).
BOOT_ID = "sys/kernel/random/boot_id"


def proc_files() -> dict[str, str]:
    """The files bound over the cell's own /proc (path under /proc -> content)."""
    return {BOOT_ID: f"{uuid.uuid4()}\n"}


# A login shell's /etc/profile on the host's root (E2B's SDK runs every command as
# `bash -l -c`): Debian's, without its `id -u` forks (a millisecond and a half each run) and
# its PATH reset, since the command's PATH is already sandcell's own (cellapi.environment).
LOGIN_PROFILE = """\
# /etc/profile of a sandcell cell: sourced by login shells; forks nothing.
if [ "${PS1-}" ]; then
  if [ "${BASH-}" ] && [ "$BASH" != "/bin/sh" ] && [ -f /etc/bash.bashrc ]; then
    . /etc/bash.bashrc
  else
    PS1='$ '
  fi
fi
"""


def scratch_sizes(policy: CellPolicy) -> tuple[int, int]:
    """Bytes of /tmp and /dev/shm. Both are tmpfs, charged to the cell's memory: kept well
    below memory_mb so that filling them is an ENOSPC for the writer, not an OOM kill."""
    mib = 1024 * 1024
    return min(policy.disk_mb, policy.memory_mb // 2) * mib, policy.memory_mb // 8 * mib


@dataclass(frozen=True)
class CellRoot:
    """What the cell's / is made of: the host's system dirs, or a built image with the
    daemon's runtime staged beside it (SPEC §12). The one place the two kinds differ."""

    binds: list[Bind]
    python: list[str]
    chdir: str
    image_root: str = ""

    @classmethod
    def of(cls, cell_dir: Path, policy: CellPolicy) -> CellRoot:
        """Raises images.stage.StageError when an image's runtime cannot be staged here."""
        # The sandbox's CA bundle (SPEC §17), in /run: the cell's own in both kinds of root.
        trust = [Bind(policy.ca_dir, CELL_CA_DIR)] if policy.ca_dir else []
        if policy.image_root is None:
            binds = [Bind(m.host, m.cell) for m in runtime_mounts()]
            return cls([*binds, *trust], [cell_python()], CELL_SRC)
        staged = image_stage.stage_runtime(cell_dir)
        if policy.ca_dir:  # the image's own bundle paths too, with the image's CAs
            ca_dir = Path(policy.ca_dir)
            trust = image_trust(policy.image_root, ca_dir, cell_dir, CELL_CA_DIR) or trust
        return cls([*staged.binds, *trust], staged.python, staged.chdir, policy.image_root)

    def etc_files(self) -> dict[str, str]:
        """The generated /etc files (name -> content): an image keeps its own profile."""
        return ETC_FILES if self.image_root else {**ETC_FILES, "profile": LOGIN_PROFILE}

    def system(self, image_root: str) -> list[str]:
        """bwrap's arguments for the read-only system; `image_root` as bwrap reaches it."""
        if not self.image_root:
            return host_system({p: os.readlink(p) for p in SYSTEM_LINKS if os.path.islink(p)})
        entries = sorted(os.listdir(self.image_root))
        home = os.path.join(self.image_root, "home")
        listed = sorted(os.listdir(home)) if os.path.isdir(home) else []
        return image_stage.root_args(image_root, entries, listed)


def cell_binds(
    cell_dir: Path, root: CellRoot, *, staged: bool
) -> tuple[list[str], list[Bind], str]:
    """The launcher's staging lines, bwrap's binds into the cell, and where bwrap finds
    the image's root (staged like the binds, never bound whole: `root.system` binds its
    entries). Not `staged` (an unprivileged launch), bwrap binds the host's paths. The
    workspace is bound at its other names too (cellapi.layout), from the same source."""
    wanted = [Bind(str(cell_dir / "workspace"), CELL_WORKSPACE, writable=True), *root.binds]
    if root.image_root:
        wanted.append(Bind(root.image_root, ""))
    lines, binds = stage(wanted) if staged else ([], list(wanted))
    bin_lines, bin_binds = _cell_bin(root, binds, staged)
    image_root = binds.pop().source if root.image_root else ""
    binds += [Bind(binds[0].source, alias, writable=True) for alias in WORKSPACE_ALIASES]
    return lines + bin_lines, binds + bin_binds, image_root


def _cell_bin(root: CellRoot, binds: list[Bind], staged: bool) -> tuple[list[str], list[Bind]]:
    """sandcell's commands for cells (isolation/cellbin: a `sudo` that says why there is
    none, a `python` for E2B's code) in /usr/local/bin, on every PATH (a login shell keeps
    the fixed one): staged, a read-only overlay over the root's own entries, from the stage's
    lower layers (no host path in its options); unprivileged (no overlay), bound only where
    the root's directory is empty, so nothing of it is hidden. `binds` are `cell_binds`'s,
    the image's root last."""
    base = os.path.realpath(root.image_root or "/")
    theirs = os.path.join(base, CELL_BIN_DIR.lstrip("/"))
    if os.path.realpath(theirs) != theirs or not os.path.isdir(theirs):
        return [], []  # none, or a link that would lead the stage elsewhere
    package = next(i for i, b in enumerate(binds) if b.dest in (CELL_SRC, image_stage.SRC))
    if not staged:
        if os.listdir(theirs):
            return [], []
        return [], [Bind(f"{binds[package].source}/{CELL_BIN}", CELL_BIN_DIR)]
    if root.image_root:
        theirs = f"{_lower(len(binds) - 1)}{CELL_BIN_DIR}"
    merged = f"{STAGE}/cellbin"
    lower = f"{_lower(package)}/{CELL_BIN}:{theirs}"
    line = f"mkdir {merged} && mount -t overlay sandcell -o ro,lowerdir={lower} {merged}"
    return [line], [Bind(merged, CELL_BIN_DIR)]


def _lower(index: int) -> str:
    """Where `stage` binds the source of its `index`th read-only bind."""
    return f"{STAGE}/lower{index}"


def stage(wanted: Sequence[Bind]) -> tuple[list[str], list[Bind]]:
    """Shell lines that stage each bind's source, and bwrap's binds from the stage."""
    lines = [
        f"mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev sandcell-stage {STAGE}",
        f"mkdir {_EMPTY_LAYER}",
    ]
    binds = []
    q = shlex.quote
    for index, bind in enumerate(wanted):
        staged = f"{STAGE}/{index}"
        if bind.writable:
            lines.append(f"mkdir {staged} && mount --bind {q(bind.source)} {staged}")
        else:
            # A file (an image's CA bundle) is staged through its directory, bound from there.
            source, name = bind.source, ""
            if os.path.isfile(source):
                source, name = os.path.split(source)
            lower = _lower(index)
            lines.append(
                f"mkdir {lower} {staged} && mount --bind {q(source)} {lower}"
                f" && mount -t overlay sandcell -o ro,lowerdir={lower}:{_EMPTY_LAYER} {staged}"
            )
            staged = f"{staged}/{name}" if name else staged
        binds.append(Bind(staged, bind.dest, bind.writable))
    return lines, binds


def own_filesystems(
    uid: int, etc_files: dict[str, str], scratch: tuple[int, int], proc_files: dict[str, str]
) -> tuple[list[str], OwnFilesystems]:
    """Shell lines that make the cell's own filesystems on the stage, as root, and bwrap's
    arguments that bind them into the cell; to follow `stage`'s lines.

    bwrap would mount them from inside the cell's user namespace, owned by the cell's host
    uid, and the kernel shows a tmpfs's owner in its mount options as the initial namespace
    sees it: `uid=200003` in the cell's mountinfo (SPEC §3: nothing there names the host uid).
    Mounted by root, they have no owner to show: the root's top directory is chowned to the
    cell's uid instead (bwrap makes its mount points there; it is read-only once bwrap is
    done), /tmp and /dev/shm are 1777. /dev holds what bwrap's --dev would (the host's
    harmless nodes, bound; a devpts instance of the cell's own; the usual links), so ptys
    still work. `etc_files` (name -> content) are written on the stage and bound read-only
    onto /etc, `proc_files` (path under /proc -> content) onto the cell's /proc once it is
    mounted; `scratch` is the size in bytes of /tmp and /dev/shm."""
    q = shlex.quote
    root, dev = _OWN_ROOT, f"{_OWN_ROOT}/dev"
    tmp_bytes, shm_bytes = scratch
    # Each line's commands are processes of their own on a cell's start path: one mkdir and
    # one touch make several entries, and umask gives the /etc files their mode.
    lines = [
        f"mkdir {root} && mount -t tmpfs -o mode=0755,size=1m,nosuid,nodev sandcell {root}",
        f"mkdir {root}/tmp {dev} && chown {uid}:{uid} {root}",  # noqa: S108 - the cell's
        f"mount -t tmpfs -o mode=1777,size={tmp_bytes},nosuid,nodev sandcell {root}/tmp",  # noqa: S108
        f"mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev sandcell {dev}",
        f"mkdir {dev}/shm {dev}/pts && touch " + " ".join(f"{dev}/{n}" for n in DEV_NODES),
        *(f"mount --bind /dev/{n} {dev}/{n}" for n in DEV_NODES),
        *(f"ln -s {q(target)} {dev}/{name}" for name, target in DEV_LINKS.items()),
        f"mount -t tmpfs -o mode=1777,size={shm_bytes},nosuid,nodev sandcell {dev}/shm",
        f"mount -t devpts -o newinstance,ptmxmode=0666,mode=620,nosuid,noexec devpts {dev}/pts",
    ]
    rest: list[str] = []
    after_proc: list[str] = []
    writes: list[str] = []
    for dest, content, args in [
        *((f"/etc/{name}", content, rest) for name, content in etc_files.items()),
        *((f"/proc/{path}", content, after_proc) for path, content in proc_files.items()),
    ]:
        staged = f"{STAGE}/{dest[1:].replace('/', '-')}"
        writes.append(f"printf %s {q(content)} > {staged}")
        args += ["--ro-bind", staged, dest]
    if writes:  # 0644 as their host originals; the subshell keeps the launcher's own umask
        lines.append("(umask 022; " + "; ".join(writes) + ")")
    return lines, OwnFilesystems(["--dev-bind", root, "/"], [*rest, "--proc", "/proc", *after_proc])
