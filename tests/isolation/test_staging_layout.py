"""What the stage gives every cell beside its workspace (SPEC §14.2): the workspace again at
/home/user, from the same source, and sandcell's sudo on /usr/local/bin; an image's /home is
built from its entries, bar the workspace's name there."""

from __future__ import annotations

from pathlib import Path

from sandcell.isolation import staging
from sandcell.isolation.bwrap import Bind
from sandcell.isolation.images.stage import root_args


def test_the_workspace_is_bound_again_at_home_user(tmp_path: Path) -> None:
    root = staging.CellRoot([Bind("/opt/pkg", staging.CELL_SRC)], ["python3"], "/")
    for staged in (True, False):
        lines, binds, image_root = staging.cell_binds(tmp_path, root, staged=staged)
        workspace = next(b for b in binds if b.dest == "/workspace")
        assert Bind(workspace.source, "/home/user", writable=True) in binds
        assert image_root == ""
    lines, binds, _ = staging.cell_binds(tmp_path, root, staged=True)
    overlay = [line for line in lines if "cellbin" in line]
    assert overlay == [
        f"mkdir {staging.STAGE}/cellbin && mount -t overlay sandcell -o ro,lowerdir="
        f"{staging.STAGE}/lower1/{staging.CELL_BIN}:/usr/local/bin {staging.STAGE}/cellbin"
    ]
    assert Bind(f"{staging.STAGE}/cellbin", "/usr/local/bin") in binds
    assert all(staging.STAGE in b.source for b in binds)  # no host path reaches bwrap


def test_an_images_home_keeps_its_entries_but_user(tmp_path: Path) -> None:
    image = tmp_path / "rootfs"
    for d in ("usr/bin", "home/node", "home/user/from-the-image", "etc"):
        (image / d).mkdir(parents=True)
    (image / "bin").symlink_to("usr/bin")
    args = root_args(str(image))
    pairs = list(zip(args[1::3], args[2::3], strict=True))
    assert (f"{image}/home/node", "/home/node") in pairs
    assert not any(dest in ("/home", "/home/user") for _, dest in pairs)
    assert ("usr/bin", "/bin") in pairs and (f"{image}/usr", "/usr") in pairs
