"""The daemon's command line, as the host starts it (cells and pods share one builder)."""

from __future__ import annotations

from collections.abc import Sequence


def daemon_args(
    *,
    uds: str | None = None,
    listen: str | None = None,
    fd: int | None = None,
    disk_quota_mb: int,
    inherit_env: Sequence[str],
    landlock: bool = False,
    deny_tcp: bool = False,
    code_python: str | None = None,
    in_cell: bool = False,
) -> list[str]:
    """Arguments after the entry point (`python -m sandcell.daemon` or `sandcell daemon`).

    Exactly one of: `uds` (a path to bind), `listen` (HOST:PORT), `fd` (a listening socket
    the host bound and handed down, as local cells do)."""
    where = {"--uds": uds, "--listen": listen, "--fd": fd}
    given = [(flag, value) for flag, value in where.items() if value is not None]
    if len(given) != 1:
        raise ValueError("exactly one of uds, listen and fd")
    flag, value = given[0]
    args = [
        flag,
        str(value),
        "--disk-quota-mb",
        str(disk_quota_mb),
        f"--inherit-env={','.join(inherit_env)}",
    ]
    if landlock:
        args += ["--landlock", *(["--deny-tcp"] if deny_tcp else [])]
    if code_python is not None:  # an image's own python3 (with IPython) for code contexts
        args.append(f"--code-python={code_python}")
    if in_cell:  # the host's word, never a caller's: `/` is then the cell's own mount view
        args.append("--in-cell")
    return args
