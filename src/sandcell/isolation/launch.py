"""The shell script that launches a cell: cgroups, rlimits, OOM protection, stage, bwrap.

As root it runs in four steps, each one process image, no Python in between:

    sh (join the cell's cgroups, set rlimits, protect the tree from the OOM killer)
      -> unshare --mount (a private mount namespace: the stage below dies with the cell)
      -> setpriv (drop to the cell's unprivileged host uid, no_new_privs)
      -> bwrap (user/pid/mount/ipc/uts/cgroup/net namespaces, seccomp) -> python daemon

The stage is a tmpfs of that private namespace where every host directory the cell sees is
mounted under a neutral name first, so that the cell's mount table (``/proc/self/mountinfo``
shows each mount's root within its filesystem) names nothing of the host (SPEC §3):

- a read-only source (the venv, the code) is shown through a read-only overlay whose lower
  layers are stage paths: the overlay's root is ``/`` and its options name the stage only;
- a writable source (the workspace) cannot be an overlay (no upper layer): it is bound as is,
  which is neutral when it is the root of its own filesystem (the loop-mounted disk image).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.isolation.bwrap import Bind

STAGE = "/run/sandcell-stage"
# The root launcher lowers its own score, which also sets the floor (oom_score_adj_min) that
# no unprivileged descendant can go below. Every process of the cell starts from it; the
# daemon then raises each command to 1000 (daemon/spawn.py), so the OOM killer takes
# commands first and the daemon last. Lowering needs CAP_SYS_RESOURCE, which root lacks in
# some containers: the daemon then keeps the host's default (0), still far below 1000.
DAEMON_OOM_SCORE_ADJ = -500
_CAP_SYS_RESOURCE = 24
_EMPTY_LAYER = f"{STAGE}/empty"  # overlayfs wants two lower layers when it has no upper one


def may_lower_oom_score() -> bool:
    """Whether this process (and so the launcher it starts) has CAP_SYS_RESOURCE."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << _CAP_SYS_RESOURCE))
    return False


@dataclass(frozen=True)
class Rlimits:
    nofile: int
    fsize_mb: int


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
            lower = f"{STAGE}/lower{index}"
            lines.append(
                f"mkdir {lower} {staged} && mount --bind {q(bind.source)} {lower}"
                f" && mount -t overlay sandcell -o ro,lowerdir={lower}:{_EMPTY_LAYER} {staged}"
            )
        binds.append(Bind(staged, bind.dest, bind.writable))
    return lines, binds


def script(
    *,
    cgroup_procs: Sequence[str],
    rlimits: Rlimits,
    bwrap_argv: Sequence[str],
    root: tuple[int, list[str]] | None,
) -> str:
    """The launcher; `root` is (the cell's host uid, the stage lines) when run as root,
    None for an unprivileged launch straight into bwrap (no stage, no uid change)."""
    q = shlex.quote
    lines = ["set -eu"]
    lines += [f"echo $$ > {q(procs)}" for procs in cgroup_procs]
    fsize_blocks = rlimits.fsize_mb * 2048  # dash counts ulimit -f in 512-byte blocks
    lines.append(f"ulimit -c 0; ulimit -n {rlimits.nofile}; ulimit -f {fsize_blocks}")
    bwrap = " ".join(q(a) for a in bwrap_argv)
    if root is None:
        lines.append(f"exec {bwrap}")
        return "\n".join(lines)
    uid, stage_lines = root
    if may_lower_oom_score():
        lines.append(f"echo {DAEMON_OOM_SCORE_ADJ} > /proc/self/oom_score_adj")
    inner = [
        *stage_lines,
        f"exec setpriv --reuid={uid} --regid={uid} --clear-groups"
        f" --no-new-privs --bounding-set=-all -- {bwrap}",
    ]
    lines.append(
        "exec unshare --mount --propagation private -- /bin/sh -c "
        + q("set -eu\n" + "\n".join(inner))
    )
    return "\n".join(lines)
