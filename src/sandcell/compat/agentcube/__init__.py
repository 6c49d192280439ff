"""agentcube compatibility (SPEC §14.1): the unmodified `agentcube-sdk` runs against sandcell.

Under `/agentcube` the router serves what the SDK calls: the workload manager's session
create/delete, and the agentcube router's invocations (PicoD's `api/execute`, `api/files`,
`health`). Every call is translated into sandcell's own path: the caller's principal, its
ownership checks, and a signed single-use token for the daemon, as for any proxied call.
"""

from sandcell.compat.agentcube.routes import OPERATIONS

__all__ = ["OPERATIONS"]
