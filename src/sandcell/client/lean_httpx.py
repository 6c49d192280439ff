"""httpx, imported without its own command line.

`httpx/__init__.py` imports `httpx._main` (the `httpx` console command) whenever click, rich
and pygments are installed, as they are beside uvicorn and typer: 30-40 ms of imports, the
largest part of httpx's, that no library use of it needs. While httpx is first imported here,
that one module is marked absent with the import system's own marker (`sys.modules[name] =
None`: "import of ... halted"), so httpx takes its fallback for a missing CLI dependency, an
`httpx.main` that explains what to install. The mark is removed at once: a later `import
httpx._main` works as usual, and the `httpx` command runs in a process of its own anyway.
tests/sdk/test_lean_imports.py pins this (an httpx that stops catching the ImportError, or
that moves its command line, fails there).
"""

from __future__ import annotations

import sys

_COMMAND_LINE = "httpx._main"


def _import_without_command_line() -> None:
    if "httpx" in sys.modules or _COMMAND_LINE in sys.modules:
        return  # imported already, by the application: nothing to save, nothing to change
    sys.modules[_COMMAND_LINE] = None  # type: ignore[assignment]
    try:
        import httpx  # noqa: F401
    finally:
        if sys.modules.get(_COMMAND_LINE, ...) is None:
            del sys.modules[_COMMAND_LINE]


_import_without_command_line()

import httpx  # noqa: E402  (after the import above has put it in sys.modules)

__all__ = ["httpx"]
