"""The limits suite of tests/cells (pids, memory, disk quota, scratch space, CPU time, a
daemon killed from the host) on cells of a built busybox image: cgroups and quotas hold for
image cells as for host cells (SPEC §12)."""

from __future__ import annotations

from cells.test_limits import *  # noqa: F403 - the same tests, collected here again

# These drive GNU tools a busybox image does not have (bash, `head -c 30M`, `ps --no-headers`,
# python3 in a shell); what they check is the cgroup's and the daemon's, covered above.
del test_fork_bomb_hits_pids_max_and_the_host_stays_responsive  # noqa: F821
del test_filling_scratch_space_gets_enospc_and_the_daemon_survives  # noqa: F821
del test_cpu_spin_past_the_timeout_is_killed_promptly  # noqa: F821
