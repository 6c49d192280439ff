"""E2B's snapshots and fork through the unmodified e2b SDK (SPEC §14.2, issue 27 item 8):
`create_snapshot`, `list_snapshots`, `delete_snapshot`, `fork` and `Sandbox.create(snapshot_id)`
map onto SPEC §13's snapshots (files only)."""

from __future__ import annotations

from e2b import Sandbox


def test_snapshot_list_create_from_and_delete(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/state.txt", "before")
    first = sbx.create_snapshot(name="base-state")
    sbx.files.write("/home/user/state.txt", "after")
    second = sbx.create_snapshot()
    assert first.snapshot_id.startswith("snap-")
    assert first.names == ["base-state"]

    listed = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
    assert {first.snapshot_id, second.snapshot_id} <= set(listed)
    pages = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1)
    seen = []
    while pages.has_next:
        items = pages.next_items()
        assert len(items) <= 1
        seen += [s.snapshot_id for s in items]
    assert seen == listed

    child = Sandbox.create(first.snapshot_id, timeout=120)
    try:
        assert child.files.read("/home/user/state.txt") == "before"
        assert child.commands.run("cat state.txt").stdout == "before"
    finally:
        child.kill()

    assert Sandbox.delete_snapshot(first.snapshot_id) is True
    assert Sandbox.delete_snapshot(first.snapshot_id) is False
    assert Sandbox.delete_snapshot(second.snapshot_id) is True
    left = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
    assert first.snapshot_id not in left
    assert second.snapshot_id not in left


def test_fork_copies_the_files_into_count_sandboxes(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/forked.txt", "shared")
    forks = sbx.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2
        for child in forks:
            assert isinstance(child, Sandbox), child
            assert child.sandbox_id != sbx.sandbox_id
            assert child.files.read("/home/user/forked.txt") == "shared"
        forks[0].files.write("/home/user/forked.txt", "changed")
        assert sbx.files.read("/home/user/forked.txt") == "shared"
    finally:
        for child in forks:
            if isinstance(child, Sandbox):
                child.kill()
    # The fork's own snapshot is gone once the children have their copies.
    assert not [s for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
