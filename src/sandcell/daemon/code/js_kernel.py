"""The javascript and typescript languages: one Node.js process per context (`js_driver.js`).

Node is the sandbox's own (`node` on its PATH: the host's in templates without an image, the
image's in the code-interpreter template); a sandbox without it refuses these languages by
name before anything starts. Typescript runs in the same driver, its types stripped first by
the `typescript` package (scripts/setup.sh installs it beside the driver from its lockfile;
an image may carry its own, where Node finds global packages).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sandcell.cellapi.environment import FIXED_PATH
from sandcell.daemon.code.python_kernel import JsonFramed
from sandcell.errors import ErrorCode, ServiceError

DRIVER = Path(__file__).with_name("js_driver.js")
NO_TYPESCRIPT = "sandcell: no typescript package for this Node.js"


class JavaScriptLanguage(JsonFramed):
    def __init__(self, name: str = "javascript") -> None:
        self.name = name

    def node(self) -> str:
        """The sandbox's `node`, or a 400 that says none is there."""
        found = shutil.which("node", path=FIXED_PATH)
        if found is None:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"{self.name} contexts need Node.js, and this sandbox has no `node` on its "
                f"PATH ({FIXED_PATH}): use the code-interpreter template, or a template whose "
                "image has Node.js",
                {"field": "language", "language": self.name},
            )
        return found

    def check(self) -> None:
        self.node()

    def argv(self, command_fd: int, event_fd: int) -> list[str]:
        return [self.node(), str(DRIVER), str(command_fd), str(event_fd), self.name]

    def env_defaults(self) -> dict[str, str]:
        return {}

    def start_failure(self, stderr_tail: str) -> str:
        if NO_TYPESCRIPT in stderr_tail:
            return (
                "typescript contexts need the `typescript` package where this sandbox's "
                "Node.js finds it (scripts/setup.sh installs it for sandcell's own Node, an "
                "image may carry it): none was found"
            )
        return f"the {self.name} context did not start: {stderr_tail[-1000:] or 'no output'}"
