"""After a restart (SPEC §6): the store made to agree with the cells that really run.

Apart from provisioning because it runs once, before anything is served, and judges every
record at once: live cells the store knows are adopted, dead ones and those whose owner asked
for their deletion are cleaned up, pauses, resumes and snapshots cut short are finished, and
cells no record names (pool cells, a create or resume that died before its record) destroyed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandcell.manager.manager import Manager


async def reconcile(m: Manager) -> dict[str, list[str]]:
    """Adopt live cells that the store knows, clean up the rest; what was done, by id."""
    cells = {_key(h.cell): h for h in await m.backend.list()}
    adopted, dropped, moving = [], [], []
    for record in await m.store.list_sandboxes():
        if not m.backend.owns(record.cell):
            continue  # another replica's cell: that replica reconciles it
        if record.state == "snapshotting":  # thawed and back to running or paused
            record = await m.persistence.settle(record)
        handle = cells.pop(_key(record.cell), None)
        if record.state in ("deleting", "deleted"):  # its owner asked for it to go
            await m.forget(record, None if handle is None else handle.cell)
            dropped.append(record.id)
            continue
        if record.state in ("pausing", "resuming"):
            moving.append(record)  # settled once the orphan cells are gone
        if record.state in ("paused", "pausing", "resuming"):
            continue
        if handle is not None and await m.backend.healthy(handle.endpoint):
            await m.backend.adopt(record.id, handle)
            adopted.append(record.id)
            continue
        await m.forget(record, None if handle is None else handle.cell)
        dropped.append(record.id)
    # Pool cells, cells whose record never landed, and a resume's new cell: a destroyed
    # cell that kept a workspace sends it home first.
    for handle in cells.values():
        await m.backend.destroy(handle.cell)
    for record in moving:
        await m.persistence.settle(record)
    return {
        "adopted": adopted,
        "dropped": dropped,
        "orphans": [str(_key(h.cell)) for h in cells.values()],
    }


def _key(cell: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(cell.items()))
