"""Label and field selectors as the API server reads them (`labelSelector`, `fieldSelector`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Matcher = Callable[[dict[str, Any]], bool]
_SET = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*$")


class SelectorError(ValueError):
    pass


def _requirements(text: str) -> list[str]:
    """Commas separate requirements, except inside the parentheses of `in (a, b)`."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in [*parts, current] if p.strip()]


def _one_label(req: str) -> Callable[[dict[str, str]], bool]:
    if m := _SET.match(req):
        key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ.match(req):
        key, op, value = m[1], m[2], m[3]
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS.match(req):
        negated, key = m[1] == "!", m[2]
        return lambda labels: (key in labels) != negated
    raise SelectorError(f"unable to parse requirement: {req!r}")


def label_selector(text: str | None) -> Matcher:
    reqs = [_one_label(r) for r in _requirements(text or "")]
    return lambda obj: all(r(obj.get("metadata", {}).get("labels") or {}) for r in reqs)


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector(text: str | None, supported: frozenset[str]) -> Matcher:
    """Only `=`, `==`, `!=` on the fields the resource supports, as the API server allows."""
    reqs = []
    for req in _requirements(text or ""):
        m = _EQ.match(req)
        if not m:
            raise SelectorError(f"invalid field selector: {req!r}")
        path, op, value = m[1], m[2], m[3]
        if path not in supported:
            raise SelectorError(f'field label not supported: "{path}"')
        negate = op == "!="
        reqs.append(lambda obj, p=path, v=value, n=negate: (_field(obj, p) == v) != n)
    return lambda obj: all(r(obj) for r in reqs)
