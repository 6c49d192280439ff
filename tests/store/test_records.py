"""Records: the derived deadline and the two serialised forms the backends rely on."""

from __future__ import annotations

import json

import pytest

from sandcell.store import ApiKeyRecord, SandboxRecord

from .helpers import T0, make_sandbox


def test_deadline_is_the_earlier_of_idle_and_max_lifetime() -> None:
    assert make_sandbox("s").deadline == T0 + 300
    assert make_sandbox("s", last_activity_at=T0 + 3500).deadline == T0 + 3600


def test_dict_form_is_json_safe_and_round_trips() -> None:
    rec = make_sandbox("s")
    assert SandboxRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec


def test_flat_form_round_trips_from_text_and_bytes() -> None:
    rec = make_sandbox("s", endpoint={"host": "10.0.0.7", "port": 8080})
    flat = rec.to_flat()
    assert all(isinstance(v, str | int | float) for v in flat.values())
    assert json.loads(flat["endpoint"]) == {"host": "10.0.0.7", "port": 8080}
    assert SandboxRecord.from_dict(flat) == rec
    as_redis_returns_it = {k: str(v).encode() for k, v in flat.items()} | {b"extra": b"x"}
    assert SandboxRecord.from_dict(as_redis_returns_it | {"extra": b"ignored"}) == rec

    key = ApiKeyRecord("ops", "ops", "ab" * 32, admin=True, created_at=T0)
    assert key.to_flat()["admin"] == 1
    assert key.to_flat()["revoked"] == 0
    assert ApiKeyRecord.from_dict({k: str(v).encode() for k, v in key.to_flat().items()}) == key


def test_invalid_state_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid sandbox state"):
        make_sandbox("s", state="zombie")
