"""The `image` table: known bases only, files from the config's directory only, and a digest
that changes exactly when the spec or its inputs do."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sandcell.isolation.images.spec import DEFAULT_MAX_UNPACKED_MB, ImageSpec, digest
from sandcell.manager.templates import ConfigError, parse_templates


def test_bases_and_their_kinds() -> None:
    assert ImageSpec().kind == "host" and not ImageSpec().built
    assert ImageSpec(base="debian:bookworm").suite == "bookworm"
    assert ImageSpec(base="oci-archive:/x.tar").archive == Path("/x.tar")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"base": "docker:alpine"}, "unknown base"),
        ({"base": "debian:"}, "unknown base"),
        ({"base": "oci-archive:"}, "unknown base"),
        ({"apt": ["git"]}, "need a base image"),
        ({"base": "oci-archive:a.tar", "apt": ["git"]}, "debian"),
        ({"base": "debian:bookworm", "apt": ["git; rm -rf /"]}, "not package names"),
        ({"base": "debian:bookworm", "files": {"etc/motd": "motd"}}, "absolute"),
        ({"base": "debian:bookworm", "files": {"/etc/../motd": "motd"}}, "normalised"),
        ({"base": "debian:bookworm", "files": {"/etc/motd": "../secret"}}, "outside"),
        ({"base": "debian:bookworm", "files": {"/etc/motd": "/etc/shadow"}}, "outside"),
        ({"base": "debian:bookworm", "workdir": "srv"}, "absolute"),
        ({"base": "debian:bookworm", "extra": 1}, "Extra inputs"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(fields: dict, match: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=match):
        ImageSpec(context_dir=str(tmp_path), **fields)


def test_a_symlink_out_of_the_config_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "motd").symlink_to("/etc/hostname")
    with pytest.raises(ValidationError, match="outside"):
        ImageSpec(base="debian:bookworm", files={"/etc/motd": "motd"}, context_dir=str(tmp_path))


def test_the_digest_follows_the_spec_and_its_inputs(tmp_path: Path) -> None:
    (tmp_path / "motd").write_text("one")
    (tmp_path / "image.tar").write_bytes(b"archive")
    spec = ImageSpec(
        base="oci-archive:image.tar", files={"/etc/motd": "motd"}, context_dir=str(tmp_path)
    )
    first = digest(spec)
    assert digest(spec) == first
    assert digest(spec.model_copy(update={"oci": "registry/x:1"})) == first  # Kubernetes only
    assert digest(spec.model_copy(update={"run": ("true",)})) != first
    (tmp_path / "motd").write_text("two")
    assert digest(spec) != first
    (tmp_path / "motd").write_text("one")
    assert digest(spec) == first
    (tmp_path / "image.tar").write_bytes(b"another archive")
    assert digest(spec) != first


def test_max_unpacked_mb_bounds_oci_bases_and_leaves_the_digest(tmp_path: Path) -> None:
    """A bound decides whether a build may finish, not what it makes: it is not in the
    digest (so raising it retries the same image, and adding it changed no built digest)."""
    (tmp_path / "image.tar").write_bytes(b"archive")
    spec = ImageSpec(base="oci-archive:image.tar", context_dir=str(tmp_path))
    assert spec.max_unpacked_mb == DEFAULT_MAX_UNPACKED_MB == 4096
    bounded = ImageSpec(base="oci-archive:image.tar", max_unpacked_mb=16, context_dir=str(tmp_path))
    assert bounded.max_unpacked_mb == 16 and digest(bounded) == digest(spec)
    # The digest this spec had before the setting existed: built images keep theirs.
    before = "7c5a9ce92f1820563e23faa16c6b16b4bc5c869a6448776d5b20bff2a07b9600"
    assert digest(ImageSpec(base="debian:bookworm", run=("true",))) == before


@pytest.mark.parametrize(
    ("image", "match"),
    [
        (
            {"base": "oci-archive:a.tar", "max_unpacked_mb": 0},
            "image.max_unpacked_mb: .*greater than or equal to 1",
        ),
        ({"base": "oci-archive:a.tar", "max_unpacked_mb": "lots"}, "image.max_unpacked_mb: "),
        ({"base": "debian:bookworm", "max_unpacked_mb": 16}, "bounds an 'oci-archive:' base"),
        ({"base": "oci-archive:a.tar", "max_unpacked": 16}, "image.max_unpacked: Extra"),
    ],
)
def test_max_unpacked_mb_in_a_config_is_checked_by_name(image: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_templates({"templates": {"t": {"image": image}}})
