"""Fixtures for images: a tiny OCI archive made here (static busybox, no Python), a store and a
builder of the test's own, and cells of the built image."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from cells.conftest import (  # cell, make_cell, host_sleeper: fixtures, of image cells here
    DEFAULT_POLICY,
    Cell,
    CellFactory,
    assert_nothing_left,
    cell,  # noqa: F401
    cells_unsupported,
    host_sleeper,  # noqa: F401
    make_cell,  # noqa: F401
    new_cgroup_parent,
)
from sandcell.isolation import cgroups
from sandcell.isolation.images.build import Builder, BuildJob
from sandcell.isolation.images.spec import ImageSpec, digest
from sandcell.isolation.images.store import ImageStore
from sandcell.isolation.policy import CellPolicy
from support import oci


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config directory holding busybox.tar."""
    path = tmp_path_factory.mktemp("images")
    oci.write_archive(path / "busybox.tar", [oci.busybox_rootfs()], env=["IMAGE_VAR=from-oci"])
    return path


@pytest.fixture(scope="module")
def busybox_spec(workdir: Path) -> ImageSpec:
    return ImageSpec(base="oci-archive:busybox.tar", context_dir=str(workdir))


@pytest.fixture(scope="module")
def build_parent() -> Iterator[str]:
    if why := cells_unsupported():
        pytest.skip(why)
    parent = new_cgroup_parent()
    yield parent
    cgroups.detect(parent).destroy_all()


@pytest.fixture(scope="module")
def builder(workdir: Path, build_parent: str) -> Iterator[Builder]:
    builder = Builder(ImageStore(workdir / "store"), cgroup_parent=build_parent)
    yield builder
    builder.store.unmount_all()


def finish(job: BuildJob) -> list[dict]:
    """Every event of the build, once it has ended."""
    return list(job.follow())


@pytest.fixture(scope="module")
def busybox_policy(builder: Builder, busybox_spec: ImageSpec) -> CellPolicy:
    events = finish(builder.start("busybox", busybox_spec))
    assert events[-1]["event"] == "done", events
    image = digest(busybox_spec)
    meta = builder.store.meta(image)
    assert meta is not None
    return replace(
        DEFAULT_POLICY,
        image_root=str(builder.store.rootfs(image)),
        image_env=tuple(meta.env.items()),
        inherit_env=(*DEFAULT_POLICY.inherit_env, *meta.env),
    )


class ImageCellFactory(CellFactory):
    """Cells of a built image: a policy without an image of its own gets `image`'s root
    and env, so the suites of tests/cells run unchanged on image cells."""

    def __init__(self, root: Path, parent: str, image: CellPolicy) -> None:
        super().__init__(root, parent)
        self.image = image

    def create(self, policy: CellPolicy = DEFAULT_POLICY, *, init: bool = True) -> Cell:
        if policy.image_root is None:
            policy = replace(
                policy,
                image_root=self.image.image_root,
                image_env=self.image.image_env,
                inherit_env=(*policy.inherit_env, *(k for k, _ in self.image.image_env)),
            )
        return super().create(policy, init=init)


@pytest.fixture(scope="module")
def factory(
    workdir: Path, build_parent: str, busybox_policy: CellPolicy, builder: Builder
) -> Iterator[ImageCellFactory]:
    f = ImageCellFactory(workdir, build_parent, busybox_policy)
    try:
        yield f
    finally:
        f.close()
        builder.store.unmount_all()  # the images' mounts are under the factory's root too
    assert_nothing_left(f)
