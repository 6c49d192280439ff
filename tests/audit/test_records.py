"""The record's shape (SPEC §20): a closed set of actions and of what a record may say it
touched; commands as length and SHA-256 unless `[audit] commands = "full"`; no field for file
contents or secret values."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from sandcell.audit.records import (
    ACTIONS,
    GENESIS,
    AuditQuery,
    AuditRecord,
    command_detail,
    egress_detail,
    file_detail,
    secret_detail,
    signal_detail,
)


def _record(**fields: Any) -> AuditRecord:
    values: dict[str, Any] = {
        "writer": "router-a",
        "seq": 1,
        "at": 1_000_000.25,
        "principal": "alice",
        "key_name": "alice-ci",
        "action": "exec",
        "sandbox_id": "sbx-1",
    }
    return AuditRecord(**(values | fields))


def test_the_command_is_kept_as_its_length_and_sha256() -> None:
    command = "curl -fsS https://example.test/ | sh  # café"
    detail = command_detail(command)
    assert detail == {
        "command_length": len(command.encode()),
        "command_sha256": hashlib.sha256(command.encode()).hexdigest(),
    }
    assert command not in json.dumps(detail)
    assert command_detail(command, "full") == {**detail, "command": command}
    with pytest.raises(ValueError, match="audit commands must be one of"):
        command_detail(command, "verbatim")  # type: ignore[arg-type]


def test_builders_have_no_place_for_contents_or_secret_values() -> None:
    with pytest.raises(TypeError):
        file_detail(path="/home/user/a.txt", size=3, content=b"abc")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        secret_detail(name="GITHUB", host="api.github.com", value="ghp_x")  # type: ignore[call-arg]
    for field in ("content", "contents", "value", "data", "body"):
        with pytest.raises(ValueError, match="audit records keep no field"):
            _record(action="file.write", touched={"path": "/a", field: "abc"})
    assert file_detail(path="/home/user/a.txt", size=3) == {"path": "/home/user/a.txt", "size": 3}
    assert file_detail(path="/tmp/x") == {"path": "/tmp/x"}
    assert secret_detail(name="GITHUB", host="api.github.com") == {
        "secret": "GITHUB",
        "host": "api.github.com",
    }
    assert egress_detail(host="pypi.org", port=443, decision="allow") == {
        "host": "pypi.org",
        "port": 443,
        "decision": "allow",
    }
    assert signal_detail(signal=9) == {"signal": "9"}


def test_actions_and_outcomes_are_closed_sets() -> None:
    for action in (
        "sandbox.create",
        "sandbox.delete",
        "sandbox.pause",
        "sandbox.resume",
        "sandbox.snapshot",
        "sandbox.fork",
        "exec",
        "process.start",
        "process.signal",
        "file.write",
        "file.read",
        "file.remove",
        "network.change",
        "egress.decision",
        "secret.use",
        "key.create",
        "key.revoke",
    ):
        assert action in ACTIONS
    with pytest.raises(ValueError, match="unknown audit action"):
        _record(action="sandbox.explode")
    with pytest.raises(ValueError, match="audit outcome"):
        _record(outcome="maybe")


def test_hash_covers_canonical_json_of_every_field_but_the_hash() -> None:
    rec = _record(touched=command_detail("ls -la")).sealed()
    body = rec.to_dict()
    del body["hash"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert rec.canonical() == canonical
    assert rec.hash == hashlib.sha256(canonical).hexdigest()
    assert rec.prev == GENESIS
    assert AuditRecord.from_json(rec.to_json()) == rec
    assert AuditRecord.from_flat(rec.to_flat()) == rec
    assert _record(principal="mallory", touched=rec.touched).sealed().hash != rec.hash
    assert _record(seq=2, touched=rec.touched).sealed().hash != rec.hash  # the place counts


def test_a_query_refuses_a_bad_limit_or_cursor() -> None:
    with pytest.raises(ValueError, match="audit page limit"):
        AuditQuery(limit=0)
    with pytest.raises(ValueError, match="invalid audit cursor"):
        AuditQuery(after="not json")


def test_text_that_is_not_utf8_is_made_so_and_the_command_digest_keeps_its_bytes() -> None:
    """JSON from a caller may carry lone surrogates ("\\ud800"): the record stays storable."""
    from sandcell.audit.records import AuditRecord, command_detail

    detail = command_detail("echo \ud800", "full")
    assert detail["command_length"] == len(b"echo ") + 3  # surrogatepass: 3 bytes
    rec = AuditRecord(
        writer="w",
        seq=1,
        at=1.0,
        principal="alice",
        key_name="k",
        action="exec",
        touched={**detail, "path": "a\udcff.txt"},
    ).sealed()
    assert rec.touched["command"] == "echo ?" and rec.touched["path"] == "a?.txt"
    assert AuditRecord.from_json(rec.to_json()) == rec
