"""Builds in build cells: a no-op when unchanged, one build for concurrent callers, nothing
half-made on failure, and a malicious layer refused inside the build cell."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from images.conftest import finish
from sandcell.isolation.images import buildcell
from sandcell.isolation.images.build import Builder
from sandcell.isolation.images.buildcell import BUILD_UID
from sandcell.isolation.images.spec import ImageSpec, digest
from support import oci


def _leftovers(builder: Builder) -> list[str]:
    return os.listdir(builder.store.root / "tmp")


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
