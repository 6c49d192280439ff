"""The daemon's settings: only non-secret values, from arguments or the environment."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.cellapi.environment import DEFAULT_INHERIT
from sandcell.cellapi.layout import SCRATCH
from sandcell.tokens import PublicKey, load_public_key

DEFAULT_WORKSPACE = "/workspace"
DEFAULT_DISK_QUOTA_MB = 1024


class ConfigError(Exception):
    """The daemon cannot start with these settings."""


@dataclass(frozen=True)
class DaemonConfig:
    sandbox_id: str
    bootstrap_key: PublicKey
    workspace: str
    uds: str | None
    listen: tuple[str, int] | None
    fd: int | None
    inherit_env: tuple[str, ...]
    disk_quota_bytes: int
    landlock: bool
    deny_tcp: bool
    code_python: str = sys.executable
    scratch: str = SCRATCH  # the cell's /tmp, which the cell-wide file table also reaches
    in_cell: bool = False  # `/` is a cell's own: the cell-wide table reads it too


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandcell daemon", description="The in-cell daemon.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", help="listen on this unix socket path")
    where.add_argument("--listen", help="listen on HOST:PORT (pods)")
    where.add_argument(
        "--fd", type=int, help="serve on this inherited listening socket (local cells)"
    )
    p.add_argument("--sandbox-id", help="default: $SANDCELL_SANDBOX_ID")
    p.add_argument("--workspace", help=f"default: $SANDCELL_WORKSPACE or {DEFAULT_WORKSPACE}")
    p.add_argument("--inherit-env", help="comma-separated allow-list replacing the default")
    p.add_argument("--disk-quota-mb", type=int, default=DEFAULT_DISK_QUOTA_MB)
    p.add_argument(
        "--landlock",
        action="store_true",
        help="confine writes to the workspace and /tmp with Landlock (fail if absent)",
    )
    p.add_argument(
        "--deny-tcp",
        action="store_true",
        help="with --landlock: deny TCP bind/connect (Landlock ABI >= 4)",
    )
    p.add_argument(
        "--code-python",
        help="the interpreter of python code contexts (needs IPython); default: this one",
    )
    p.add_argument(
        "--in-cell",
        action="store_true",
        help="started by a cell's launcher: the cell-wide file table reads the cell's root",
    )
    return p


def _bootstrap_pem(env: Mapping[str, str]) -> bytes:
    if pem := env.get("SANDCELL_BOOTSTRAP_PUBLIC_KEY"):
        return pem.encode()
    if path := env.get("SANDCELL_BOOTSTRAP_PUBLIC_KEY_FILE"):
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read bootstrap public key file: {exc}") from exc
    raise ConfigError("no bootstrap public key: set SANDCELL_BOOTSTRAP_PUBLIC_KEY(_FILE)")


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen takes HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def load(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> DaemonConfig:
    args = _parser().parse_args(argv)
    sandbox_id = args.sandbox_id or env.get("SANDCELL_SANDBOX_ID")
    if not sandbox_id:
        raise ConfigError("no sandbox id: pass --sandbox-id or set SANDCELL_SANDBOX_ID")
    try:
        key = load_public_key(_bootstrap_pem(env))
    except ValueError as exc:
        raise ConfigError(f"bad bootstrap public key: {exc}") from exc
    inherit = DEFAULT_INHERIT
    if args.inherit_env is not None:
        inherit = tuple(n for n in args.inherit_env.split(",") if n)
    if args.disk_quota_mb <= 0:
        raise ConfigError("--disk-quota-mb must be positive")
    return DaemonConfig(
        sandbox_id=sandbox_id,
        bootstrap_key=key,
        workspace=args.workspace or env.get("SANDCELL_WORKSPACE") or DEFAULT_WORKSPACE,
        uds=args.uds,
        listen=_listen_address(args.listen) if args.listen else None,
        fd=args.fd,
        inherit_env=inherit,
        disk_quota_bytes=args.disk_quota_mb * 1024 * 1024,
        landlock=args.landlock,
        deny_tcp=args.deny_tcp,
        code_python=args.code_python or sys.executable,
        in_cell=args.in_cell,
    )
