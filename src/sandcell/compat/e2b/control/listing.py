"""E2B's list queries: the filters of a sandbox list (`metadata`, `state`, `template`,
`startedAfter`, `order`) and the pages of any list (`limit`, `nextToken`, `X-Next-Token`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request

from sandcell.compat.e2b.control.common import _refused, _template

MAX_PAGE = 100  # E2B's default and largest page

Row = TypeVar("Row")


def _instant(field: str, text: str) -> float:
    """An RFC 3339 time of a query (a `+` of its offset may arrive as a space)."""
    try:
        when = datetime.fromisoformat(text.strip().replace(" ", "+").replace("Z", "+00:00"))
    except ValueError:
        raise _refused(field, "must be an RFC 3339 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _filter(rows: list[dict[str, Any]], request: Request) -> list[dict[str, Any]]:
    """E2B's list query: `metadata` (an urlencoded `k=v&...` string), `state`, `template`
    (E2B's name or sandcell's), `startedAfter` (inclusive: a sandbox's own start finds it),
    and `order` by start (newest first by default, as E2B lists)."""
    query = request.query_params
    # The SDK quotes each key and value, then urlencodes the lot: two decodings.
    wanted = [(unquote(k), unquote(v)) for k, v in parse_qsl(query.get("metadata", ""))]
    rows = [r for r in rows if all(r["metadata"].get(k) == v for k, v in wanted)]
    if states := query.get("state"):
        rows = [r for r in rows if r["state"] in states.split(",")]
    if template := query.get("template"):
        rows = [r for r in rows if r["templateID"] in (template, _template(template))]
    if after := query.get("startedAfter"):
        since = _instant("startedAfter", after)
        rows = [r for r in rows if _instant("startedAt", r["startedAt"]) >= since]
    rows.sort(key=_sandbox_key, reverse=descending(request, "desc"))
    return rows


def descending(request: Request, default: str) -> bool:
    """Whether a list's `order` (`default` when absent) is newest first."""
    order = request.query_params.get("order", default)
    if order not in ("asc", "desc"):
        raise _refused("order", "must be asc or desc")
    return order == "desc"


def _sandbox_key(row: dict[str, Any]) -> str:
    return f"{_instant('startedAt', row['startedAt']):017.6f}/{row['sandboxID']}"


def _limit(request: Request, most: int) -> int | None:
    raw = request.query_params.get("limit")
    if raw is None:
        return None  # E2B's first API (GET /sandboxes) has no pages: all of them
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise _refused("limit", f"must be an integer from 1 to {most}")
    return int(raw)


def _page(
    request: Request, rows: list[Row], key: Callable[[Row], str], desc: bool = False
) -> tuple[list[Row], dict]:
    """E2B's pagination over `rows` sorted by `key` (descending when `desc`): `limit` rows
    after the `nextToken` (the last row's key), and `X-Next-Token` when more follow. A key
    orders, so a row deleted between pages loses no other."""
    limit = _limit(request, MAX_PAGE)
    if after := request.query_params.get("nextToken"):
        rows = [r for r in rows if (key(r) < after if desc else key(r) > after)]
    page = rows if limit is None else rows[:limit]
    return page, ({"X-Next-Token": key(page[-1])} if len(rows) > len(page) else {})
