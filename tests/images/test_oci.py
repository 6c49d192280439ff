"""Unpacking OCI archives: layers in order, whiteouts honoured, and every way out of the root
refused (absolute names, `..`, paths through symlinks, hard links outside, bad digests,
whiteouts naming `..`, modes set through a later symlink), and the unpacked size bounded
(gzip bombs of one file or many, sparse files, hard links)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from sandcell.isolation.images.oci import OciError, unpack
from sandcell.isolation.images.spec import MIB
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


def _staged(tmp_path: Path) -> tuple[Path, Path]:
    """A root inside a staging directory, as a build has it (rootfs beside config.json): an
    escape shows as the sibling or the root gone."""
    staging = tmp_path / "staging"
    root = staging / "rootfs"
    root.mkdir(parents=True)
    (staging / "config.json").write_text("{}")
    return staging, root


def _bytes_on_disk(root: Path) -> int:
    seen: set[int] = set()
    total = 0
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_blocks * 512
    return total


LOWER = [directory("a"), file("a/kept", b"lower"), file("top", b"lower")]


@pytest.mark.parametrize(
    "whiteout",
    [".wh...", "a/.wh..", ".wh..", ".wh.", "a/.wh...", "a/.wh.", "a/.wh..wh.plnk"],
)
def test_whiteouts_naming_no_entry_of_their_directory_are_refused(
    tmp_path: Path, whiteout: str
) -> None:
    """`.wh...` named the root's parent (the build emptied its own staging directory, then
    died with a traceback); `.wh.` and `.wh..` the directory holding them. Each is refused
    by name, and nothing of the root, its staging directory or the lower layer is gone."""
    staging, root = _staged(tmp_path)
    archive = oci.write_archive(tmp_path / "image.tar", [LOWER, [file(whiteout, b"")]])
    with pytest.raises(OciError, match="does not name an entry") as refused:
        unpack(archive, root)
    assert repr(whiteout) in str(refused.value)
    assert (staging / "config.json").read_text() == "{}"
    assert (root / "a/kept").read_bytes() == b"lower" and (root / "top").exists()


@pytest.mark.parametrize(
    "upper",
    [
        [file("esc/.wh.config.json", b"")],
        [file("esc/.wh..wh..opq", b"")],
        [file("esc/rootfs/.wh.top", b"")],
    ],
)
@pytest.mark.parametrize("target", ["..", "ABSOLUTE"])
def test_whiteouts_through_a_symlink_are_refused(
    tmp_path: Path, upper: list[oci.Entry], target: str
) -> None:
    staging, root = _staged(tmp_path)
    link = symlink("esc", str(staging) if target == "ABSOLUTE" else target)
    archive = oci.write_archive(tmp_path / "image.tar", [[*LOWER, link], upper])
    with pytest.raises(OciError, match="symlink"):
        unpack(archive, root)
    assert (staging / "config.json").read_text() == "{}"
    assert (root / "top").exists()


def test_a_whiteout_of_a_symlink_removes_the_link_not_its_target(tmp_path: Path) -> None:
    staging, root = _staged(tmp_path)
    links = [symlink("up", ".."), symlink("abs", str(staging))]
    whiteouts = [file(".wh.up", b""), file(".wh.abs", b"")]
    archive = oci.write_archive(tmp_path / "image.tar", [links, whiteouts])
    unpack(archive, root)
    assert os.listdir(root) == []
    assert sorted(os.listdir(staging)) == ["config.json", "rootfs"]


def test_entries_inside_a_whiteout_name_are_refused(tmp_path: Path) -> None:
    _, root = _staged(tmp_path)
    archive = oci.write_archive(tmp_path / "image.tar", [[file(".wh.x/y", b"")]])
    with pytest.raises(OciError, match="inside a whiteout"):
        unpack(archive, root)


def test_aufs_metadata_is_skipped(tmp_path: Path) -> None:
    """Old Docker layers carry aufs's own `.wh..wh.plnk/` and `.wh..wh.aufs`: not the image's."""
    aufs = [directory(".wh..wh.plnk"), file(".wh..wh.plnk/12.34", b"x"), file(".wh..wh.aufs", b"")]
    root = _unpack(tmp_path, [[*aufs, file("kept", b"k")]])
    assert os.listdir(root) == ["kept"]


def test_opaque_directories_hide_lower_entries_only_in_any_order(tmp_path: Path) -> None:
    """The marker hides the lower layers' entries of its directory, deeper ones too, never
    this layer's own, whether listed before it or after (parents included)."""
    lower = [directory("b"), file("b/old", b"o"), directory("b/sub"), file("b/sub/old", b"o")]
    lower += [file("x", b"lower")]
    upper = [file("b/sub/new", b"n"), file("b/.wh..wh..opq", b""), file("b/after", b"a")]
    upper += [file(".wh..wh..opq", b""), file("y", b"upper")]
    root = _unpack(tmp_path, [lower, upper])
    assert sorted(os.listdir(root)) == ["b", "y"]
    assert sorted(os.listdir(root / "b")) == ["after", "sub"]
    assert os.listdir(root / "b/sub") == ["new"]


def test_a_whiteout_leaves_its_own_layers_entry_and_makes_no_directories(tmp_path: Path) -> None:
    upper = [file("x", b"x"), file(".wh.x", b""), file(".wh.gone", b"")]
    root = _unpack(tmp_path, [[file("gone", b"g")], upper, [file("m/n/.wh.o", b"")]])
    assert os.listdir(root) == ["x"]


def test_directory_modes_never_follow_a_later_symlink(tmp_path: Path) -> None:
    """Modes were set by path at the end: a directory that a later layer turned into a
    symlink to `..` changed the staging directory's mode (and that of whatever the link
    reached). Now the link stays a link and nothing outside changes."""
    staging, root = _staged(tmp_path)
    (staging / "e").mkdir()
    for path in (staging, staging / "e"):
        path.chmod(0o755)
    tight = [oci.Entry("d", kind=tarfile.DIRTYPE, mode=0o500)]
    tight.append(oci.Entry("d/e", kind=tarfile.DIRTYPE, mode=0o500))
    archive = oci.write_archive(tmp_path / "image.tar", [tight, [symlink("d", "..")]])
    unpack(archive, root)
    assert (root / "d").readlink() == Path("..")
    assert {(p.stat().st_mode & 0o777) for p in (staging, staging / "e")} == {0o755}


def test_directory_modes_apply_through_real_directories(tmp_path: Path) -> None:
    tight = [oci.Entry("d", kind=tarfile.DIRTYPE, mode=0o500), file("d/f", b"f")]
    root = _unpack(tmp_path, [tight])
    assert (root / "d").stat().st_mode & 0o777 == 0o700  # the owner keeps write and search
    assert (root / "d/f").read_bytes() == b"f"


@pytest.mark.parametrize(
    ("entry", "shown"),
    [(file("n" * 300, b""), "'nnnn"), (symlink("s", "t" * 5000), "'s'")],
)
def test_an_entry_that_cannot_be_placed_is_an_error_naming_it(
    tmp_path: Path, entry: oci.Entry, shown: str
) -> None:
    """A name past NAME_MAX, a link target past PATH_MAX: an OciError naming the entry (the
    build's one-line message), not an OSError's traceback."""
    _, root = _staged(tmp_path)
    archive = oci.write_archive(tmp_path / "image.tar", [[entry]])
    with pytest.raises(OciError, match="cannot be placed") as refused:
        unpack(archive, root)
    assert shown in str(refused.value) and len(str(refused.value)) < 400


BOUND = 16 * MIB
GIB = 1 << 30


def _bomb(tmp_path: Path, layers: list[list[oci.Entry] | bytes], bound: int = BOUND) -> int:
    """Unpacks under `bound`, expecting the refusal; returns the bytes left on disk."""
    _, root = _staged(tmp_path)
    archive = oci.write_archive(tmp_path / "image.tar", layers)
    with pytest.raises(OciError, match=r"past its bound of 16 MiB \(image.max_unpacked_mb\)"):
        unpack(archive, root, bound)
    return _bytes_on_disk(root)


def test_a_gzip_bomb_of_one_file_is_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    layer = oci.zeros_layer([("bomb", GIB)])
    assert len(layer) < 1.1 * MIB  # about 1,000:1
    assert _bomb(tmp_path, [layer]) < 64 * 1024


def test_a_gzip_bomb_of_many_files_stops_at_the_bound(tmp_path: Path) -> None:
    """Each 1 MiB file fits; their sum does not: the bytes really written are counted, and
    the refusal comes when they would pass the bound, not after 1 GiB."""
    layer = oci.zeros_layer([(f"f{i}", MIB) for i in range(1024)])
    assert len(layer) < 1.1 * MIB
    assert _bomb(tmp_path, [layer]) <= BOUND


def test_a_sparse_file_counts_its_holes(tmp_path: Path) -> None:
    """A GNU sparse member of 1 GiB of hole is a 10 KiB archive, and would be 1 GiB of
    zeros in the image: refused by its real size."""
    layer = oci.sparse_layer("holes", GIB, tmp_path)
    assert len(layer) < 64 * 1024
    assert _bomb(tmp_path, [layer]) < 64 * 1024


def test_hard_links_count_as_entries_not_as_copies(tmp_path: Path) -> None:
    """Links to a 6 MiB file share its data (five copies would pass 16 MiB): they fit. Five
    thousand links to an empty file are 20 MiB of entries: refused."""
    links = [file("big", bytes(6 * MIB)), *(hardlink(f"l{i}", "big") for i in range(4))]
    archive = oci.write_archive(tmp_path / "links.tar", [links])
    root = tmp_path / "root"
    root.mkdir()
    unpack(archive, root, BOUND)
    assert (root / "l3").stat().st_nlink == 5
    many = [file("empty", b""), *(hardlink(f"l{i}", "empty") for i in range(5000))]
    assert _bomb(tmp_path / "many", [many]) < BOUND


def test_a_file_rewritten_by_a_later_layer_counts_again(tmp_path: Path) -> None:
    """Every layer's bytes are written (Docker counts an image's layers alike)."""
    ten = file("ten", bytes(10 * MIB))
    assert _bomb(tmp_path, [[ten], [ten]]) <= BOUND
