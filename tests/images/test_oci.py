"""Unpacking OCI archives: layers in order, whiteouts honoured, and every way out of the root
refused (absolute names, `..`, paths through symlinks, hard links outside, bad digests)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sandcell.isolation.images.oci import OciError, unpack
from support import oci
from support.oci import directory, file, hardlink, symlink


def _unpack(tmp_path: Path, layers: list[list[oci.Entry]], **config: object) -> Path:
    archive = oci.write_archive(tmp_path / "image.tar", layers, **config)  # type: ignore[arg-type]
    root = tmp_path / "root"
    root.mkdir()
    unpack(archive, root)
    return root


def test_layers_apply_in_order_with_config(tmp_path: Path) -> None:
    archive = oci.write_archive(
        tmp_path / "image.tar",
        [[directory("etc"), file("etc/a", b"1")], [file("etc/a", b"2"), file("etc/b", b"3")]],
        env=["GREETING=hi", "PATH=/bin"],
        workdir="/srv",
    )
    root = tmp_path / "root"
    root.mkdir()
    config = unpack(archive, root)
    assert (root / "etc/a").read_bytes() == b"2"
    assert (root / "etc/b").read_bytes() == b"3"
    assert config.env == {"GREETING": "hi", "PATH": "/bin"}
    assert config.workdir == "/srv"


def test_whiteouts_remove_lower_entries(tmp_path: Path) -> None:
    lower = [directory("a"), file("a/gone", b"x"), file("a/kept", b"y"), directory("b")]
    lower += [file("b/old", b"z")]
    upper = [file("a/.wh.gone", b""), file("b/.wh..wh..opq", b""), file("b/new", b"n")]
    root = _unpack(tmp_path, [lower, upper])
    assert sorted(p.name for p in (root / "a").iterdir()) == ["kept"]
    assert sorted(p.name for p in (root / "b").iterdir()) == ["new"]


def test_symlinks_stay_links_and_setuid_bits_are_dropped(tmp_path: Path) -> None:
    root = _unpack(
        tmp_path,
        [[directory("bin"), file("bin/tool", b"#!", 0o4755), symlink("bin/abs", "/etc/passwd")]],
    )
    assert (root / "bin/abs").readlink() == Path("/etc/passwd")
    assert (root / "bin/tool").stat().st_mode & 0o7777 == 0o755


@pytest.mark.parametrize(
    ("layers", "reason"),
    [
        ([[file("../outside", b"pwned")]], "traversal"),
        ([[file("a/../../outside", b"pwned")]], "traversal"),
        ([[file("/outside", b"pwned")]], "absolute"),
        ([[symlink("esc", "/"), file("esc/outside", b"pwned")]], "symlink"),
        ([[symlink("esc", ".."), file("esc/outside", b"pwned")]], "symlink"),
        ([[symlink("d", "/")], [file("d/outside", b"pwned")]], "symlink"),
        ([[hardlink("link", "../outside")]], "traversal"),
        ([[symlink("s", "/"), hardlink("link", "s/outside")]], "symlink"),
    ],
)
def test_writes_outside_the_root_are_refused(
    tmp_path: Path, layers: list[list[oci.Entry]], reason: str
) -> None:
    (tmp_path / "outside").write_bytes(b"original")
    archive = oci.write_archive(tmp_path / "image.tar", layers)
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(OciError, match=reason):
        unpack(archive, root)
    assert (tmp_path / "outside").read_bytes() == b"original"


def test_a_blob_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    archive = oci.write_archive(tmp_path / "image.tar", [[file("x", b"1")]])
    tampered = tmp_path / "tampered.tar"
    with tarfile.open(archive) as src, tarfile.open(tampered, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.startswith("blobs/") and data[:2] == b"\x1f\x8b":
                data = oci.gzip.compress(oci.layer_tar([file("x", b"evil")]))
                member.size = len(data)
            dst.addfile(member, oci.io.BytesIO(data))
    with pytest.raises(OciError, match="digest"):
        unpack(tampered, tmp_path)


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({}, "index.json"),
        ({"index.json": b"{not json"}, "index.json"),
        ({"index.json": json.dumps({"schemaVersion": 2, "manifests": []}).encode()}, "index"),
        (
            {
                "index.json": json.dumps(
                    {
                        "schemaVersion": 2,
                        "manifests": [
                            {"mediaType": "x", "digest": "sha256:" + "0" * 64, "size": 1}
                        ],
                    }
                ).encode()
            },
            "no regular file",
        ),
    ],
)
def test_malformed_layouts_are_refused(tmp_path: Path, files: dict[str, bytes], match: str) -> None:
    archive = tmp_path / "bad.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, oci.io.BytesIO(data))
    with pytest.raises(OciError, match=match):
        unpack(archive, tmp_path)


def test_a_missing_or_non_tar_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OciError, match="cannot read"):
        unpack(tmp_path / "missing.tar", tmp_path)
    (tmp_path / "text.tar").write_text("not a tar")
    with pytest.raises(OciError, match="cannot read"):
        unpack(tmp_path / "text.tar", tmp_path)
