"""agentcube session ids, and who may use one.

agentcube's data-plane client sends no credential, only `x-agentcube-session-id`, so the id is
the credential (like a preview URL): `<sandbox id>.<mac>`, the MAC an HMAC-SHA256 of the
sandbox id under a server key kept sealed in the store (every replica accepts every
replica's ids). It dies with its sandbox: the sandbox is looked up on every call, and sandbox
ids are never reused. A call that also carries a Bearer API key must come from the sandbox's
owner (an admin key included), so a key cannot borrow another principal's session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re

from starlette.requests import Request

from sandcell.errors import ErrorCode, ServiceError
from sandcell.router.auth import Principal
from sandcell.router.core import GONE
from sandcell.store import SandboxRecord

SESSION_KEY_NAME = "agentcube-session-key"
SESSION_HEADER = "x-agentcube-session-id"
NAMESPACE_LABEL = "agentcube.namespace"
_SESSION_ID = re.compile(r"^(sbx-[0-9a-f]{1,64})\.([A-Za-z0-9_-]{43})$")


class SessionIds:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, sandbox_id: str) -> str:
        payload = f"agentcube-session:{sandbox_id}".encode()
        digest = hmac.new(self._key, payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def mint(self, sandbox_id: str) -> str:
        return f"{sandbox_id}.{self._mac(sandbox_id)}"

    def verify(self, session_id: str) -> str | None:
        """The sandbox id of a genuine session id; None for anything else."""
        m = _SESSION_ID.match(session_id)
        if m is None or not hmac.compare_digest(m.group(2), self._mac(m.group(1))):
            return None
        return m.group(1)


async def session_ids(request: Request) -> SessionIds:
    """One key for every replica, created by whichever asks first."""
    state = request.app.state
    if getattr(state, "agentcube_session_ids", None) is None:
        key = await state.router.store.put_secret_if_absent(SESSION_KEY_NAME, os.urandom(32))
        state.agentcube_session_ids = SessionIds(key)
    return state.agentcube_session_ids


async def caller(request: Request) -> Principal | None:
    """The API key's principal when the request has one (a wrong key is a 401), else None."""
    if not request.headers.get("authorization"):
        return None
    return await request.app.state.router.principal(request)


async def session_sandbox(
    request: Request, session_id: str, principal: Principal | None
) -> SandboxRecord:
    """The running sandbox of `session_id`, if `principal` (when given) owns it; else 404
    (whether it exists is not revealed)."""
    router = request.app.state.router
    sandbox_id = (await session_ids(request)).verify(session_id)
    record = await router.store.get_sandbox(sandbox_id) if sandbox_id else None
    if record is not None and principal is not None and not principal.owns(record.owner):
        record = None
    if record is not None and record.state in GONE:
        record = None
    # A session id is its key's credential: it dies when the key is revoked.
    if record is None or not await router.owner_active(record):
        raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, "no such agentcube session")
    # The owner's limits bound a keyless call too; a paused sandbox wakes as on /v1.
    router.door.admit(request.scope, record.owner)
    return record
