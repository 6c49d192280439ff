"""The session's leak check (tests/support/leaks.py) blames a process of a cell uid that this
run made and no live cell claims, and only that: not one that ran before the session, nor one
of a live cell of another sandcell beside it. Real processes of real uids, no mocks."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cells.conftest import requires_cells
from sandcell.isolation.uids import DEFAULT_UID_BASE, DEFAULT_UID_COUNT, UID_REGISTRY
from support.leaks import HostSnapshot, find_leaks, outside_prefix

NOBODY = 65534


def free_uids(count: int) -> list[int]:
    """Unclaimed uids from the top of the range (other sandcells claim from the bottom)."""
    top = DEFAULT_UID_BASE + DEFAULT_UID_COUNT - 1
    found = [u for u in range(top, top - 200, -1) if not (UID_REGISTRY / str(u)).exists()]
    return found[:count]


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        proc.kill()
        proc.wait()


def sleep_as(uid: int, made: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "300"], user=uid, group=uid, stdin=subprocess.DEVNULL)
    made.append(proc)
    return proc


def blamed(leaks: list[str], proc: subprocess.Popen[bytes]) -> bool:
    return any(line.startswith(f"process {proc.pid} ") for line in leaks)


@requires_cells
def test_a_process_of_an_unclaimed_cell_uid_made_during_the_run_is_a_leak(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    (uid,) = free_uids(1)
    before = HostSnapshot.take()
    survivor = sleep_as(uid, sleepers)  # what outlives a cell's deletion: no claim, no cgroup
    assert blamed(find_leaks(before, tmp_path), survivor)


@requires_cells
def test_what_ran_before_the_run_or_a_live_foreign_cell_claims_is_not_blamed(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    earlier_uid, foreign_uid = free_uids(2)
    earlier = sleep_as(earlier_uid, sleepers)
    before = HostSnapshot.take()
    again = sleep_as(earlier_uid, sleepers)  # a cell that ran before, starting a command
    # A cell of another sandcell, made while this run goes on, alive at its end.
    session, foreign_dir = tmp_path / "session", tmp_path / "elsewhere" / "cells" / "cforeign"
    session.mkdir()
    foreign_dir.mkdir(parents=True)
    claim = UID_REGISTRY / str(foreign_uid)
    UID_REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
    claim.write_text(str(foreign_dir))
    try:
        foreign = sleep_as(foreign_uid, sleepers)
        leaks = find_leaks(before, session)
        assert not [p for p in (earlier, again, foreign) if blamed(leaks, p)], leaks
    finally:
        claim.unlink()
        foreign_dir.rmdir()


@requires_cells
def test_an_unprivileged_process_is_judged_by_the_session_it_names(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """An unprivileged cell runs as its caller's shared uid: only the paths on its command
    line (its bwrap's binds) say whose it is."""
    session, other = tmp_path / "session", tmp_path / "other"
    session.mkdir()
    before = HostSnapshot.take()

    def named(basetemp: Path) -> subprocess.Popen[bytes]:
        path = f"/tmp/{outside_prefix(basetemp)}x/cells/c1/workspace"
        # A shell that waits on its builtin `read`: no child, and its command line stays.
        argv = ["sh", "-c", "read line", path]
        proc = subprocess.Popen(argv, user=NOBODY, group=NOBODY, stdin=subprocess.PIPE)
        sleepers.append(proc)
        return proc

    ours, theirs = named(session), named(other)
    leaks = find_leaks(before, session)
    assert blamed(leaks, ours) and not blamed(leaks, theirs), leaks
