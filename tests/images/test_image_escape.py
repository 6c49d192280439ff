"""The escape suite of tests/cells, run against cells of a built busybox image (SPEC §12: the
env allow-list, seccomp, Landlock, cgroups and namespaces hold for image cells exactly as for
host cells). The attacks are the same functions; the module's `factory` makes image cells."""

from __future__ import annotations

from cells.test_escape import *  # noqa: F403 - the attacks themselves, collected here again
