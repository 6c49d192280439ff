"""E2B's control API (`E2B_API_URL`): sandboxes created, listed, killed and kept alive by
the router's own operations, for the principal of the caller's key (`X-API-KEY`).

Each call is the router's own operation for that principal: the same checks, limits and
ownership as `/v1`, called directly (no request is made up). The routes are a table
(`OPERATIONS`, table.py), each handler wrapped once by `_secured` (keys.py): the key is
checked before any handler runs, and every error leaves in E2B's REST shape. The handlers
live by job: sandboxes.py, network.py, lifecycle.py, snapshots.py, metrics.py; listing.py
filters and pages the lists, models.py holds the request models, common.py what they share.
"""

from __future__ import annotations

from sandcell.compat.e2b.control.keys import SCHEME, SECURITY, sandcell_key
from sandcell.compat.e2b.control.metrics import Samples
from sandcell.compat.e2b.control.table import OPERATIONS

__all__ = ["OPERATIONS", "SCHEME", "SECURITY", "Samples", "sandcell_key"]
