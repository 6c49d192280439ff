"""Builds in build cells: a no-op when unchanged, one build for concurrent callers, nothing
half-made on failure, and a malicious layer (a traversal, a symlink escape, a whiteout
naming `..`, a gzip bomb) refused inside the build cell with a message naming it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from images.conftest import finish
from sandcell.isolation.images import buildcell
from sandcell.isolation.images.build import Builder
from sandcell.isolation.images.buildcell import BUILD_UID
from sandcell.isolation.images.spec import MIB, ImageSpec, digest
from support import oci


def _leftovers(builder: Builder) -> list[str]:
    return os.listdir(builder.store.root / "tmp")


@dataclass
class Discarded:
    """What each failed build's staging directory held when the build discarded it."""

    roots: list[list[str] | None] = field(default_factory=list)
    bytes_on_disk: list[int] = field(default_factory=list)


@pytest.fixture
def discarded(builder: Builder, monkeypatch: pytest.MonkeyPatch) -> Discarded:
    seen = Discarded()
    discard = builder.store.discard

    def watching(staging: Path) -> None:
        root = staging / "rootfs"
        seen.roots.append(sorted(os.listdir(root)) if root.is_dir() else None)
        files = [p for p in staging.rglob("*") if not p.is_symlink()]
        seen.bytes_on_disk.append(sum(p.lstat().st_blocks * 512 for p in files))
        discard(staging)

    monkeypatch.setattr(builder.store, "discard", watching)
    return seen


def test_build_steps_stream_and_publish_a_root_owned_read_only_image(
    builder: Builder, workdir: Path
) -> None:
    (workdir / "motd").write_text("welcome\n")
    spec = ImageSpec(
        base="oci-archive:busybox.tar",
        files={"/etc/motd": "motd"},
        run=("echo built-as-$(id -u) > /etc/built-by",),
        context_dir=str(workdir),
    )
    events = finish(builder.start("custom", spec))
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == ["unpack", "files", "run 1"], events
    done = events[-1]
    assert done["event"] == "done" and done["image"]["digest"] == digest(spec), events
    root = builder.store.rootfs(digest(spec))
    assert (root / "etc/motd").read_text() == "welcome\n"
    assert (root / "etc/built-by").read_text() == "built-as-0\n"  # root inside its namespace
    assert {os.lstat(p).st_uid for p in (root, root / "etc/built-by", root / "bin/sh")} == {0}
    assert not (root / ".sandcell").exists()
    assert _leftovers(builder) == []


def test_an_unchanged_spec_is_a_no_op_with_the_same_digest(
    builder: Builder, busybox_spec: ImageSpec
) -> None:
    first = finish(builder.start("busybox", busybox_spec))
    built_at = builder.store.meta(digest(busybox_spec)).built_at  # type: ignore[union-attr]
    again = finish(builder.start("busybox", busybox_spec))
    assert [e["event"] for e in again] == ["done"]
    assert again[-1]["image"]["digest"] == first[-1]["image"]["digest"]
    assert again[-1]["image"]["built_at"] == built_at


def test_concurrent_builds_of_one_spec_are_one_build(builder: Builder, workdir: Path) -> None:
    spec = ImageSpec(base="oci-archive:busybox.tar", run=("sleep 0.5",), context_dir=str(workdir))
    jobs = [builder.start("slow", spec) for _ in range(3)]
    assert jobs[0] is jobs[1] is jobs[2]
    assert finish(jobs[0])[-1]["event"] == "done"


def test_a_failing_step_reports_step_and_log_and_leaves_nothing(
    builder: Builder, workdir: Path
) -> None:
    spec = ImageSpec(
        base="oci-archive:busybox.tar",
        run=("echo first line; echo the reason >&2; exit 3",),
        context_dir=str(workdir),
    )
    events = finish(builder.start("broken", spec))
    failed = events[-1]
    assert failed["event"] == "failed", events
    assert failed["error"]["step"] == "run 1"
    assert "status 3" in failed["error"]["message"]
    assert failed["error"]["log"][-2:] == ["first line", "the reason"]
    state = builder.store.state(digest(spec))
    assert state.state == "failed" and state.error == failed["error"]
    assert not builder.store.rootfs(digest(spec)).exists()
    assert _leftovers(builder) == []


def test_a_missing_archive_fails_the_unpack_step(builder: Builder, workdir: Path) -> None:
    spec = ImageSpec(base="oci-archive:nowhere.tar", context_dir=str(workdir))
    failed = finish(builder.start("missing", spec))[-1]
    assert failed["error"]["step"] == "unpack"
    assert "no OCI archive" in failed["error"]["message"]


def test_pip_on_an_image_without_python_fails_clearly(builder: Builder, workdir: Path) -> None:
    spec = ImageSpec(base="oci-archive:busybox.tar", pip=("six",), context_dir=str(workdir))
    failed = finish(builder.start("nopython", spec))[-1]
    assert failed["error"]["step"] == "pip"
    assert any("python3" in line for line in failed["error"]["log"]), failed


def test_a_malicious_layer_is_refused_in_the_build_cell(builder: Builder, workdir: Path) -> None:
    """Path traversal and a symlink escape, each in its own archive: the build fails at
    unpack, the target outside is untouched, and no image exists."""
    target = workdir / "victim"
    target.write_text("original")
    attacks = {
        "traversal.tar": [[oci.file("../../victim", b"pwned")]],
        "symlink.tar": [[oci.symlink("esc", str(workdir))], [oci.file("esc/victim", b"pwned")]],
    }
    for name, layers in attacks.items():
        oci.write_archive(workdir / name, layers)
        spec = ImageSpec(base=f"oci-archive:{name}", context_dir=str(workdir))
        failed = finish(builder.start(name, spec))[-1]
        assert failed["event"] == "failed" and failed["error"]["step"] == "unpack", failed
        assert "refused" in "\n".join(failed["error"]["log"])
        assert target.read_text() == "original"
        assert not builder.store.rootfs(digest(spec)).exists()
    assert _leftovers(builder) == []
    assert BUILD_UID not in {os.stat(p).st_uid for p in workdir.iterdir()}


def test_whiteouts_naming_the_root_or_its_parent_fail_the_build_by_name(
    builder: Builder, workdir: Path, busybox_spec: ImageSpec, discarded: Discarded
) -> None:
    """`.wh...` emptied the build's own staging directory from inside the build cell and
    `a/.wh..` deleted `a`, each ending in a traceback. Now the unpack step fails with the
    entry in its message, the staging directory is whole until the build discards it, and
    the store's other images are untouched."""
    assert finish(builder.start("busybox", busybox_spec))[-1]["event"] == "done"
    images = builder.store.digests()
    other = builder.store.rootfs(digest(busybox_spec))
    other_entries = sorted(os.listdir(other))
    lower = [oci.directory("a"), oci.file("a/f", b"1")]
    for name, whiteout in {"dotdot.tar": ".wh...", "dot.tar": "a/.wh.."}.items():
        oci.write_archive(workdir / name, [lower, [oci.file(whiteout, b"")]])
        spec = ImageSpec(base=f"oci-archive:{name}", context_dir=str(workdir))
        failed = finish(builder.start(name, spec))[-1]
        assert failed["event"] == "failed" and failed["error"]["step"] == "unpack", failed
        reason = f"layer 2: whiteout {whiteout!r} does not name an entry of its directory"
        assert failed["error"]["message"] == f"{reason}; refused"
        assert not any("Traceback" in line for line in failed["error"]["log"]), failed
        assert builder.store.state(digest(spec)).state == "failed"
    assert discarded.roots == [["a"], ["a"]]
    assert builder.store.digests() == images and sorted(os.listdir(other)) == other_entries
    assert _leftovers(builder) == []


def test_a_gzip_bomb_fails_the_build_at_max_unpacked_mb(
    builder: Builder, workdir: Path, discarded: Discarded
) -> None:
    """A 1 MiB gzip layer of 1,024 files of 1 MiB of zeros (1 GiB unpacked) under a 16 MiB
    bound: refused at the file that passes it, with at most 16 MiB written."""
    layer = oci.zeros_layer([(f"f{i}", MIB) for i in range(1024)])
    oci.write_archive(workdir / "bomb.tar", [layer])
    spec = ImageSpec(base="oci-archive:bomb.tar", max_unpacked_mb=16, context_dir=str(workdir))
    failed = finish(builder.start("bomb", spec))[-1]
    assert failed["event"] == "failed" and failed["error"]["step"] == "unpack", failed
    assert failed["error"]["message"] == (
        "layer 1: 'f15' takes the unpacked image past its bound of 16 MiB "
        "(image.max_unpacked_mb); refused"
    )
    assert len(discarded.bytes_on_disk) == 1 and discarded.bytes_on_disk[0] <= 16 * MIB
    assert not builder.store.rootfs(digest(spec)).exists()
    assert _leftovers(builder) == []


def test_hard_links_size_the_published_image_once(builder: Builder, workdir: Path) -> None:
    """A thousand links to a 4 MiB file are 4 MiB of data: the image was sized (and
    reported) as 4 GiB."""
    links = [oci.file("big", bytes(4 * MIB)), *(oci.hardlink(f"l{i}", "big") for i in range(1000))]
    oci.write_archive(workdir / "links.tar", [links])
    spec = ImageSpec(base="oci-archive:links.tar", context_dir=str(workdir))
    done = finish(builder.start("links", spec))[-1]
    assert done["event"] == "done", done
    assert done["image"]["size_bytes"] == 4 * MIB
    assert os.stat(builder.store.rootfs(digest(spec)) / "l999").st_nlink == 1001


def test_a_hanging_step_is_killed_whole_at_its_timeout(
    builder: Builder, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(buildcell, "STEP_TIMEOUT_S", 1.0)
    spec = ImageSpec(
        base="oci-archive:busybox.tar",
        run=("echo waiting; sleep 60 & sleep 60",),  # a child holding the output open too
        context_dir=str(workdir),
    )
    started = time.monotonic()
    failed = finish(builder.start("hangs", spec))[-1]
    assert time.monotonic() - started < 20
    assert failed["error"]["message"] == "timed out after 1 s"
    assert failed["error"]["log"] == ["waiting"]
    assert _leftovers(builder) == []


def test_another_process_building_the_same_image_is_waited_for(
    builder: Builder, workdir: Path
) -> None:
    """Two builders on one store (two replicas on one host): one builds, the other follows
    the store's lock and reports the same image."""
    other = Builder(builder.store, cgroup_parent=builder.cells.cgroup_parent)
    spec = ImageSpec(base="oci-archive:busybox.tar", run=("sleep 1",), context_dir=str(workdir))
    first = builder.start("shared", spec)
    while not first.events:
        time.sleep(0.01)
    second = finish(other.start("shared", spec))
    assert [e["event"] for e in second] == ["log", "done"]
    assert second[0]["line"] == "another process is building this image"
    assert finish(first)[-1]["image"] == second[-1]["image"]
