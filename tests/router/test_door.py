"""The door's accounting: what is taken is given back wherever the holder ends, each key
has its share, keyless callers share a bounded part, and sessions stay below the file
limit. In-process: the real-server attacks are in tests/reliability/test_one_door.py."""

from __future__ import annotations

import contextlib
import resource

import pytest

from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import BODY_BUDGET
from sandcell.router.door import HOLDS, Door, Limits, anonymous


def _code(fn: object) -> ErrorCode:
    with pytest.raises(ServiceError) as refused:
        fn()  # type: ignore[operator]
    return refused.value.code


def test_a_keys_slots_come_back_when_its_requests_end_however_they_end() -> None:
    door = Door(Limits(max_inflight=8, max_inflight_per_key=2))
    for _ in range(10):  # more requests than the share: each gives its slot back
        with contextlib.ExitStack() as holds:
            scope = {HOLDS: holds}
            door.admit(scope, "alice")
            door.admit(scope, "alice")  # a request pays once, however often it names a payer
            assert door.slots.by_key["alice"] == 1
        with pytest.raises(RuntimeError), contextlib.ExitStack() as holds:
            door.admit({HOLDS: holds}, "alice")
            raise RuntimeError("the handler failed")
    assert door.slots.held == 0 and not door.slots.by_key


def test_a_key_gets_its_share_and_no_more() -> None:
    door = Door(Limits(max_inflight=8, max_inflight_per_key=2))
    with contextlib.ExitStack() as holds:
        for _ in range(2):
            door.admit({HOLDS: holds}, "alice")
        assert _code(lambda: door.admit({HOLDS: holds}, "alice")) is ErrorCode.RATE_LIMITED
        door.admit({HOLDS: holds}, "bob")  # another key still has its own share


def test_keyless_callers_share_a_bounded_part_of_the_slots() -> None:
    door = Door(Limits(max_inflight=16, max_inflight_per_key=4, max_inflight_anonymous=6))
    with contextlib.ExitStack() as holds:
        for owner in ("alice", "bob"):
            for _ in range(3):
                door.admit({HOLDS: holds}, anonymous(owner))
        refused = _code(lambda: door.admit({HOLDS: holds}, anonymous("carol")))
        assert refused is ErrorCode.OVERLOADED
        for _ in range(4):  # the keys' own slots are untouched
            door.admit({HOLDS: holds}, "alice")


def test_a_requests_body_lease_is_paid_back() -> None:
    door = Door(Limits(body_budget_bytes=4 << 20, body_budget_per_key_bytes=2 << 20))
    with contextlib.ExitStack() as holds:
        scope: dict = {HOLDS: holds}
        door.admit(scope, "alice")
        scope[BODY_BUDGET].cover(2 << 20)
        assert door.bodies.used == 2 << 20
    assert door.bodies.used == 0


def test_sessions_are_bounded_per_key_in_all_and_below_the_file_limit() -> None:
    door = Door(Limits(max_sessions_per_key=2, max_sessions=3))
    with door.session("alice"), door.session("alice"):
        assert _code(lambda: door.session("alice").__enter__()) is ErrorCode.RATE_LIMITED
        with door.session("bob"):
            assert _code(lambda: door.session("carol").__enter__()) is ErrorCode.OVERLOADED
    assert door.sessions.held == 0
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    derived = Limits().session_cap()
    assert 2 * derived < soft  # two descriptors a session, with room for everything else
    assert Limits(max_sessions=10**6).session_cap() == derived
