"""A `debian:<suite>` image from the Debian archive (mmdebstrap) with one apt and one pip
package, and a sandbox of it. Slow (about a minute, downloads from deb.debian.org and PyPI);
set SANDCELL_SKIP_NETWORK_TESTS=1 on a machine without them."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cells.conftest import DEFAULT_POLICY, CellFactory
from images.conftest import finish
from sandcell.isolation.images.build import Builder
from sandcell.isolation.images.spec import ImageSpec, digest
from sandcell.manager.templates import builtin_templates

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(os.environ.get("SANDCELL_SKIP_NETWORK_TESTS")), reason="network tests skipped"
    ),
    pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="needs mmdebstrap"),
]


def test_a_debian_image_with_apt_and_pip_packages_runs_sandboxes(
    builder: Builder, factory: CellFactory, workdir: Path
) -> None:
    spec = ImageSpec(
        base="debian:bookworm",
        apt=("hello",),
        pip=("six==1.16.0",),
        run=("hello > /etc/greeting",),
        context_dir=str(workdir),
    )
    events = finish(builder.start("debian", spec))
    assert events[-1]["event"] == "done", events[-12:]
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == ["bootstrap", "pip", "run 1"]
    assert any("Successfully installed six" in e.get("line", "") for e in events)
    assert [e["event"] for e in finish(builder.start("debian", spec))] == ["done"]

    policy = replace(DEFAULT_POLICY, image_root=str(builder.store.rootfs(digest(spec))))
    cell = factory.create(policy)
    try:
        r = cell.sh("hello; cat /etc/greeting; python3 -c 'import six; print(six.__version__)'")
        assert r["stdout"] == "Hello, world!\nHello, world!\n1.16.0\n", r
        r = cell.sh("grep ^ID= /etc/os-release; id -u; touch /usr/x 2>&1 || echo read-only")
        assert r["stdout"].splitlines()[:2] == ["ID=debian", "1000"], r
        assert r["stdout"].endswith("read-only\n"), r
    finally:
        cell.destroy()


def test_an_apt_package_that_does_not_exist_fails_the_bootstrap_step(
    builder: Builder, workdir: Path
) -> None:
    spec = ImageSpec(
        base="debian:bookworm", apt=("sandcell-no-such-package",), context_dir=str(workdir)
    )
    failed = finish(builder.start("no-package", spec))[-1]
    assert failed["event"] == "failed" and failed["error"]["step"] == "bootstrap", failed
    assert "sandcell-no-such-package" in "\n".join(failed["error"]["log"])
    assert not builder.store.rootfs(digest(spec)).exists()


@pytest.mark.skipif(
    not os.environ.get("SANDCELL_TEST_CODE_INTERPRETER"),
    reason="the code-interpreter image takes minutes; set SANDCELL_TEST_CODE_INTERPRETER=1",
)
def test_the_builtin_code_interpreter_image(builder: Builder, factory: CellFactory) -> None:
    template = builtin_templates()["code-interpreter"]
    events = finish(builder.start(template.name, template.image))
    assert events[-1]["event"] == "done", events[-12:]
    root = str(builder.store.rootfs(digest(template.image)))
    cell = factory.create(replace(DEFAULT_POLICY, memory_mb=1024, image_root=root))
    try:
        probe = "import numpy, pandas, matplotlib, ipykernel, IPython; print('ok')"
        r = cell.run(["python3", "-c", probe], timeout_s=120)
        assert r["stdout"] == "ok\n", r
    finally:
        cell.destroy()
