"""`[audit]` in the configuration file: every key checked, refused by name when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings


def settings_of(tmp_path: Path, text: str):
    config = tmp_path / "sandcell.toml"
    config.write_text(text)
    return load_settings(config, tmp_path / "data")


def test_defaults_record_digests_with_no_sink_and_no_retention(tmp_path: Path) -> None:
    audit = settings_of(tmp_path, "").audit
    assert (audit.enabled, audit.commands, audit.sink, audit.retention()) == (
        True,
        "digest",
        None,
        None,
    )
    assert audit.writer_for(8700).endswith(":8700")


def test_a_full_table_is_taken(tmp_path: Path) -> None:
    audit = settings_of(
        tmp_path,
        '[audit]\ncommands = "full"\nsink = "logs/audit.jsonl"\nmax_age_days = 30\n'
        'max_records = 1000\nwriter = "router-a"\n',
    ).audit
    assert audit.commands == "full"
    assert audit.sink == tmp_path / "logs" / "audit.jsonl"  # beside the config file
    retention = audit.retention()
    assert retention is not None
    assert (retention.max_age_s, retention.max_records) == (30 * 86400, 1000)
    assert audit.writer_for(8700) == "router-a"


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('commands = "text"', "commands"),
        ("commands = 1", "commands"),
        ("sink = 3", "sink"),
        ('sink = ""', "sink"),
        ("max_age_days = 0", "max_age_days"),
        ("max_age_days = true", "max_age_days"),
        ("max_records = -1", "max_records"),
        ("max_records = 1.5", "max_records"),
        ('writer = "a\\nb"', "writer"),
        ('enabled = "no"', "enabled"),
        ('enabled = false\ncommands = "full"', "commands"),
        ("colour = 1", "colour"),
    ],
)
def test_a_wrong_key_is_refused_by_name(tmp_path: Path, table: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        settings_of(tmp_path, f"[audit]\n{table}\n")


def test_audit_must_be_a_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[audit\]"):
        settings_of(tmp_path, 'audit = "on"\n')
