"""Records of what an operator does on the server's host with `sandcell keys` (SPEC §20):
such a command has no API key of its own, so its records name the host's user
(`operator:<user>`) and go into a chain of the host's commands, `operator@<host name>`.

Two commands may run at once on one host: the chain's append is refused to the later one
(`AuditConflictError`, nothing written), which takes up the chain again and retries."""

from __future__ import annotations

import getpass
import socket
from typing import TYPE_CHECKING

from sandcell.audit.chain import AuditLog
from sandcell.audit.records import Action, AuditConflictError, Outcome, Touched

if TYPE_CHECKING:
    from sandcell.store import Store

ATTEMPTS = 8


def operator_writer() -> str:
    return f"operator@{socket.gethostname()}"


def operator() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except (KeyError, OSError):  # a uid without a passwd entry
        return "operator"


async def record_operator(
    store: Store, action: Action, touched: Touched, status: int = 200
) -> None:
    outcome: Outcome = "ok" if status < 400 else "refused"
    for attempt in range(ATTEMPTS):
        log = AuditLog(store, operator_writer())  # a fresh one takes the chain up from its head
        try:
            await log.append(
                action,
                principal=operator(),
                key_name="",
                outcome=outcome,
                status=status,
                touched=touched,
            )
            return
        except AuditConflictError:
            if attempt == ATTEMPTS - 1:
                raise
