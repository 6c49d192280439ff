"""sudo in a sandbox (SPEC §14.2 "Root"): sandcell offers no root this round, and `sudo` says
so, with exit status 1, instead of `sudo: not found`; it runs nothing, so it gains nothing."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from e2b.sandbox.commands.command_handle import CommandExitException

pytestmark = pytest.mark.slow

MESSAGE = (
    "sudo: sandcell cells run without root; install into the workspace instead"
    " (python3 -m venv ~/.venv) or build a template with it (docs/e2b.md)"
)


def test_sudo_apt_get_says_there_is_no_root(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as raised:
        sbx.commands.run("sudo apt-get install -y cowsay")
    assert raised.value.exit_code == 1
    assert MESSAGE in raised.value.stderr
    assert "not found" not in raised.value.stderr
    venv = sbx.commands.run("python3 -m venv ~/.venv && ~/.venv/bin/python -c 'import sys'")
    assert venv.exit_code == 0  # what the message offers works, as the sandbox's user


def test_sudo_runs_nothing_and_gains_nothing(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as raised:
        sbx.commands.run("sudo id -u > /home/user/as-root; sudo -s touch /home/user/by-sudo")
    assert raised.value.exit_code == 1
    assert MESSAGE in raised.value.stderr
    assert sbx.files.read("/home/user/as-root") == ""  # `id` never ran, as root or not
    assert not sbx.files.exists("/home/user/by-sudo")
    who = sbx.commands.run('id -u; command -v sudo; test -u "$(command -v sudo)" || echo plain')
    assert who.stdout.split() == ["1000", "/usr/local/bin/sudo", "plain"]  # no setuid bit
    with pytest.raises(CommandExitException):  # nor a way to write where it lives
        sbx.commands.run("echo 'exec \"$@\"' > /usr/local/bin/sudo")
