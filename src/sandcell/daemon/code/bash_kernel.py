"""The bash language: one persistent bash process (`bash_driver.sh`) per context."""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping
from pathlib import Path

from sandcell.daemon.code.results import Event, RunOutput, error_event
from sandcell.errors import ErrorCode, ServiceError

DRIVER = Path(__file__).with_name("bash_driver.sh")
BASH = "/bin/bash"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BashLanguage:
    name = "bash"

    def argv(self, command_fd: int, event_fd: int) -> list[str]:
        return [BASH, "--noprofile", "--norc", str(DRIVER), str(command_fd), str(event_fd)]

    def check(self) -> None:
        pass  # /bin/bash is every root's

    def env_defaults(self) -> dict[str, str]:
        return {}

    def frame(self, run_id: int, code: str, env: Mapping[str, str]) -> bytes:
        """The code as a quoted here-document (no expansion; its delimiter unguessable),
        sourced by the shell (not a subshell) with the run's env assigned for that run only."""
        for name in env:
            if not _NAME.fullmatch(name):
                raise ServiceError(
                    ErrorCode.BAD_REQUEST,
                    f"{name!r} is not a shell variable name",
                    {"field": "env"},
                )
        end = f"__sandcell_{secrets.token_hex(16)}"
        assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in env.items())
        # Sourced from fd 9, with stdin /dev/null: a command that reads stdin must not read
        # the rest of the code. Lines as bash's `read` counts them: on "\n" only.
        body = code.removesuffix("\n").split("\n")
        lines = [f"{assignments}. /dev/fd/9 9<<'{end}' </dev/null", *body, end]
        text = "\n".join(lines) + "\n"
        return f"{run_id} {len(lines)}\n{text}".encode("utf-8", "surrogatepass")

    def finish(self, done: Event, output: RunOutput) -> int | None:
        status = done.get("status")
        if isinstance(status, int) and status != 0 and output.error is None:
            output.fail(error_event("ExitCodeError", f"exit status {status}"))
        count = done.get("execution_count")
        return count if isinstance(count, int) else None

    def start_failure(self, stderr_tail: str) -> str:
        return f"the bash context did not start: {stderr_tail[-1000:] or 'no output'}"
