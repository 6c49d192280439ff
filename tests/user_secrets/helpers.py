"""What the secrets tests share (a module, not conftest, so tests can import it)."""

from __future__ import annotations

from support.server import OPEN_TEMPLATE

# `default` lets a create open any egress (its own default is none); `listed` has an allow
# list of its own that a secret's hosts join; `closed` allows no egress at all.
CONFIG = (
    OPEN_TEMPLATE
    + """
[templates.listed]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 0
network = "allowlist"
network_allow = ["pypi.org"]
network_max = "allowlist"

[templates.closed]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 0
network_max = "none"
"""
)
