"""The command environment, built from an allow-list and never inherited wholesale (SPEC §2.3)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sandcell.errors import ErrorCode, ServiceError

FIXED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_INHERIT = (
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "TZ",
    "TMPDIR",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "LD_LIBRARY_PATH",
)


def validate_env(env: Mapping[str, str], field: str = "env") -> None:
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"invalid environment variable name {name!r}",
                {"field": field},
            )
        if "\0" in value:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"environment variable {name!r} contains a NUL byte",
                {"field": field},
            )


def build_env(
    *,
    workspace: str,
    inherit: Iterable[str],
    source: Mapping[str, str],
    defaults: Mapping[str, str],
    request: Mapping[str, str] | None,
) -> dict[str, str]:
    """A fresh dict: fixed values, allow-listed names from `source`, defaults, then request."""
    env = {"PATH": FIXED_PATH, "HOME": workspace}
    env.update({name: source[name] for name in inherit if name in source})
    env.update(defaults)
    if request:
        env.update(request)
    return env
