"""The escape suite of tests/cells, run against cells of a built image (SPEC §12: the env
allow-list, seccomp, Landlock, cgroups and namespaces hold for image cells exactly as for host
cells). The attacks are the same functions; only the fixtures making cells differ."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from cells.conftest import Cell, CellFactory, host_sleeper  # noqa: F401 - a fixture
from cells.test_escape import *  # noqa: F403 - the attacks themselves, collected here again
from sandcell.isolation.policy import CellPolicy


@pytest.fixture(scope="module")
def cell(factory: CellFactory, busybox_policy: CellPolicy) -> Iterator[Cell]:
    c = factory.create(busybox_policy)
    yield c
    c.destroy()


@pytest.fixture
def make_cell(factory: CellFactory, busybox_policy: CellPolicy) -> Iterator[Callable[..., Cell]]:
    """Cells of the image with the test's own limits."""
    made: list[Cell] = []

    def make(policy: CellPolicy | None = None, **kwargs: Any) -> Cell:
        image = {"image_root": busybox_policy.image_root, "image_env": busybox_policy.image_env}
        made.append(factory.create(replace(policy or busybox_policy, **image), **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.destroy()
