"""The audit trail (SPEC §20): `Audit.list(...)`, one page of records, oldest first.

```python
from sandcell.client.audit import Audit

page = Audit.list(sandbox=sbx.id, action="exec")
for rec in page["records"]:
    print(rec["at"], rec["principal"], rec["action"], rec["touched"])
more = Audit.list(after=page["next"]) if page["next"] else None
```
A key reads its own records; an admin key everyone's (and may pass `principal`).
"""

from __future__ import annotations

import json
from typing import Any

from sandcell.client.binding import AsyncBound, SyncBound, classoperation
from sandcell.client.config import ClientConfig, retry_policy
from sandcell.client.protocol import Op, Request, call_json


def cursor_after(record: dict[str, Any]) -> str:
    """The `after` that continues from `record` (what a page's `next` is for its last)."""
    return json.dumps([record["at"], record["writer"], record["seq"]], separators=(",", ":"))


class AuditBase:
    @classoperation
    def list(
        cls,
        sandbox: str | None = None,
        action: str | None = None,
        principal: str | None = None,
        since: float | str | None = None,
        until: float | str | None = None,
        after: str | None = None,
        limit: int = 100,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[dict[str, Any]]:
        """A page: {"records": [...], "next": cursor or None}. `since`/`until`: epoch
        seconds or ISO 8601 with an offset."""
        given = {
            "sandbox": sandbox,
            "action": action,
            "principal": principal,
            "since": since,
            "until": until,
            "after": after,
            "limit": limit,
        }
        params = {k: str(v) for k, v in given.items() if v is not None}
        request = Request("GET", "/v1/audit", params=params)
        return (yield from call_json(request, retry_policy(url, api_key, config)))


class Audit(SyncBound, AuditBase):
    __doc__ = AuditBase.__doc__


class AsyncAudit(AsyncBound, AuditBase):
    __doc__ = AuditBase.__doc__
