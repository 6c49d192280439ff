"""A typer group whose commands live in modules imported on first use.

Building a command costs its module's import and typer's reading of its signature; a run of
`sandcell run` needs one module of client commands, not the eight (~10 ms of the start)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, ClassVar

import typer
import typer.main
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer._click import Command, Context


class LazyGroup(TyperGroup):
    """`homes` names, for each lazily loaded command, its module under `sandcell.cli`, whose
    `register(app)` adds that module's commands (and sub-groups) to a typer app."""

    homes: ClassVar[dict[str, str]] = {}

    def list_commands(self, ctx: Context) -> list[str]:
        loaded = super().list_commands(ctx)
        return [*loaded, *(name for name in self.homes if name not in loaded)]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        home = self.homes.get(cmd_name)
        if home is not None and cmd_name not in self.commands:
            self.commands.update(commands_of(home))
        return super().get_command(ctx, cmd_name)


def commands_of(home: str) -> dict[str, Command]:
    """The commands that `sandcell.cli.<home>` registers, built as typer builds its own."""
    app = typer.Typer()
    importlib.import_module(f"sandcell.cli.{home}").register(app)
    return dict(typer.main.get_group(app).commands)
