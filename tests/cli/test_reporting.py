"""How the client commands report a failure: one line, `sandcell: CODE: message`, and the
exit code of the command's kind; no server needed (the SDK's calls are replaced)."""

from __future__ import annotations

import contextlib

import pytest
from typer.testing import CliRunner

import sandcell.cli.sandboxes
import sandcell.cli.terminal
from sandcell.cli import app
from sandcell.client.errors import SandboxUnreachableError


def test_an_attach_that_ends_without_an_exit_status_is_sandbox_unreachable(
    monkeypatch: pytest.MonkeyPatch,
):
    def gone(*args: object, **kwargs: object) -> int:
        raise SandboxUnreachableError("the connection closed before the command ended")

    monkeypatch.setattr(
        sandcell.cli.sandboxes, "connected", lambda *a: contextlib.nullcontext(object())
    )
    monkeypatch.setattr(sandcell.cli.terminal, "interactive", gone)
    done = CliRunner().invoke(app, ["exec", "-i", "sbx-1", "--", "cat"])
    assert done.exit_code == 125
    assert done.stderr == (
        "sandcell: SANDBOX_UNREACHABLE: the connection closed before the command ended\n"
    )
