"""Sandbox lifecycle over a backend and a store: create, claim, init and delete.

Provisioning lives here; expiry (`reaper`) and the start-up reconciliation (`reconcile`) are
apart, each driving the create, pause and delete paths of this module rather than its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from sandcell import telemetry, tokens
from sandcell.audit.trail import AuditTrail, recorded
from sandcell.cellapi.environment import validate_env
from sandcell.errors import ErrorCode, ServiceError
from sandcell.isolation.policy import IsolationUnavailable
from sandcell.logs import counted
from sandcell.manager.backend import Backend, CellHandle
from sandcell.manager.images import TemplateImages
from sandcell.manager.init import InitFailed, initialize, put_default_env
from sandcell.manager.persistence import Persistence
from sandcell.manager.pool import WarmCell, WarmPool
from sandcell.manager.reaper import DEFAULT_REAP_INTERVAL_S, Reaper
from sandcell.manager.reconcile import reconcile
from sandcell.manager.snapshots import DEFAULT_QUOTA_BYTES, Snapshots
from sandcell.manager.templates import Template
from sandcell.network.environment import proxy_env
from sandcell.network.policy import NetworkPolicy
from sandcell.store import Reservation, SandboxRecord, SnapshotRecord, Store

log = logging.getLogger("sandcell.manager")

BOOTSTRAP_KEY_NAME = "bootstrap-private-key"
DEFAULT_INIT_TIMEOUT_S = 10.0
# Paused sandboxes a key may keep (SPEC §13): each keeps its workspace, up to its whole
# disk_mb, for its paused TTL, so this times the largest disk_mb bounds what one key can
# hold on the server's disk without a cell (a sparse image costs only what was written).
DEFAULT_MAX_PAUSED_PER_KEY = 16


def new_sandbox_id() -> str:
    return f"sbx-{secrets.token_hex(8)}"


async def load_bootstrap_key(store: Store) -> tokens.PrivateKey:
    """Generated once; replicas starting together agree on the first one stored."""
    pem = await store.put_secret_if_absent(
        BOOTSTRAP_KEY_NAME, tokens.private_pem(tokens.generate_p256())
    )
    return tokens.load_private_key(pem)


class Manager:
    def __init__(
        self,
        store: Store,
        backend: Backend,
        templates: dict[str, Template],
        bootstrap_key: tokens.PrivateKey,
        *,
        init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S,
        reap_interval_s: float = DEFAULT_REAP_INTERVAL_S,
        images: TemplateImages | None = None,
        snapshot_quota_bytes: int = DEFAULT_QUOTA_BYTES,
        max_paused_per_key: int = DEFAULT_MAX_PAUSED_PER_KEY,
    ) -> None:
        self.store = store
        self.images = images or TemplateImages(None)
        self.backend = backend
        self.templates = templates
        self.bootstrap_key = bootstrap_key
        self.bootstrap_pem = tokens.public_pem(bootstrap_key)
        self.init_timeout_s = init_timeout_s
        self.max_paused_per_key = max_paused_per_key
        self.pools = {
            name: WarmPool(name, t.warm_pool, self._preparer(t), backend)
            for name, t in templates.items()
        }
        self.init_failures = 0
        self.reaper = Reaper(self, reap_interval_s)
        self._deleting: dict[str, asyncio.Lock] = {}
        self._teardowns: dict[str, asyncio.Task[None]] = {}
        self.persistence = Persistence(self)
        self.snapshots = Snapshots(self, snapshot_quota_bytes)
        self.audit: AuditTrail | None = None  # SPEC §20: set by `serve`

    # -- service lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        found = await self.reconcile()
        if found["adopted"] or found["dropped"]:
            log.info(
                "from the last run: %s adopted, %s cleaned up",
                counted(len(found["adopted"]), "live sandbox", "live sandboxes"),
                counted(len(found["dropped"]), "dead one", "dead ones"),
            )
        if removed := await self.snapshots.remove_orphans():
            log.info("removed %s", counted(len(removed), "unfinished snapshot", "ones"))
        self.images.on_ready(lambda _: self._refill_ready_pools())
        self._refill_ready_pools()  # the others fill once their image is built
        self.reaper.start()

    def _refill_ready_pools(self) -> None:
        for name, pool in self.pools.items():
            if self.images.ready(self.templates[name]):
                pool.refill()

    async def stop(self) -> None:
        """Stops background work and empties the pools; live sandboxes keep running."""
        await self.reaper.stop()
        await self.wait_teardowns()  # a deleted sandbox leaves nothing behind at exit
        drained = sum([await pool.drain() for pool in self.pools.values()])
        log.info(
            "warm pools drained: %s destroyed",
            counted(drained, "unclaimed cell", "unclaimed cells"),
        )
        await asyncio.to_thread(self.images.close)

    async def shutdown(self, *, delete_sandboxes: bool = False) -> list[str]:
        """After `stop`: the ids of the sandboxes this backend runs, which stay running for the
        next start to adopt, or which are deleted first with `delete_sandboxes`."""
        if delete_sandboxes:
            await self.retry_teardowns(await self.store.list_sandboxes())
        records = [r for r in await self.store.list_sandboxes() if self.backend.owns(r.cell)]
        if delete_sandboxes:
            for record in records:
                await self.delete_sandbox(record.id)
        return [r.id for r in records]

    # -- sandboxes ------------------------------------------------------------------------

    def template(self, name: str) -> Template:
        if name not in self.templates:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"unknown template {name!r}",
                {"templates": sorted(self.templates)},
            )
        return self.templates[name]

    async def create_sandbox(
        self,
        owner: str,
        template_name: str = "default",
        *,
        idle_timeout_s: int | None = None,
        max_lifetime_s: int | None = None,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        network: Any = None,
        reservation: Reservation | None = None,
        auto_resume: bool = True,
        on_timeout: str = "delete",
        snapshot: SnapshotRecord | None = None,
        resources: dict[str, Any] | None = None,
        secrets: dict[str, str] | None = None,
    ) -> SandboxRecord:
        """A running sandbox (on a copy of `snapshot`'s workspace if given); the record takes
        `reservation`'s slot, which is given back if the create fails. On failure nothing of
        the sandbox is left."""
        home = ""
        try:
            template_name = _template_of(template_name, snapshot)
            template = self.template(template_name)
            within_lifetime(template, idle_timeout_s=idle_timeout_s, max_lifetime_s=max_lifetime_s)
            policy = template.network_policy(network)  # 400 malformed, 403 wider than the cap
            env = env or {}
            validate_env(env)  # before any cell is made: the daemon would refuse it at init
            own = template.resources(resources)  # 400 beyond the template's max_*
            resources = own if own != template.resources() else {}
            # Pooled cells were initialised before anyone's env was known, with the proxy
            # variables of the template's default policy.
            init_env = {**proxy_env(policy), **env}
            pooled = not env and proxy_env(policy) == proxy_env(template.egress_policy())
            sandbox_id = new_sandbox_id()
            if secrets:  # SPEC §17: the cell trusts its sandbox's CA, staged before it starts
                init_env = {**init_env, **await self.backend.cell_trust(sandbox_id)}
            if snapshot is not None:
                home = await self.snapshots.workspace_from(snapshot, sandbox_id)
                warm = await self.prepare(
                    template, init_env, sandbox_id=sandbox_id, workspace=home, resources=resources
                )
            else:
                with telemetry.span("sandbox.claim", {"sandcell.template": template_name}):
                    claimed = (
                        await self.pools[template_name].claim()
                        if pooled and not resources
                        else None
                    )
                    telemetry.annotate({"sandcell.warm": claimed is not None})
                warm = claimed or await self.prepare(
                    template, init_env, sandbox_id=sandbox_id, resources=resources
                )
        except BaseException:
            await _each_step(
                lambda: self._release(reservation), lambda: self.backend.discard_workspace(home)
            )
            raise
        now = time.time()
        lifetime_s = max_lifetime_s or template.max_lifetime_s
        record = SandboxRecord(
            id=warm.sandbox_id,
            owner=owner,
            template=template_name,
            state="running",
            created_at=now,
            expires_at=now + lifetime_s,
            idle_timeout_s=idle_timeout_s or template.idle_timeout_s,
            last_activity_at=now,
            metadata=metadata or {},
            env=env,
            backend=self.backend.name,
            endpoint=warm.handle.endpoint,
            cell=warm.handle.cell,
            network=policy.public(),
            auto_resume=auto_resume,
            on_timeout=on_timeout,
            lifetime_s=lifetime_s,
            workspace=home,
            resources=resources,
            secrets=secrets or {},  # name -> placeholder (SPEC §17)
        )
        try:
            await self.store.put_sandbox(record, reservation)
            await self.store.put_session_key(record.id, tokens.private_pem(warm.session_key))
        except BaseException:
            # The cell first: it holds a uid, memory and processes, and the store may be the
            # very thing that failed.
            await _each_step(
                lambda: self.backend.destroy(warm.handle.cell),
                lambda: self.backend.discard_workspace(home),
                lambda: self.store.delete_sandbox(record.id),
                lambda: self._release(reservation),
            )
            raise
        self.reaper.due_at(record.deadline)  # a short timeout ends on time, not a pass late
        return record

    async def _release(self, reservation: Reservation | None) -> None:
        if reservation is not None:
            await self.store.release_reservation(reservation)

    def _preparer(self, template: Template) -> Callable[[], Awaitable[WarmCell]]:
        """What a warm pool calls to make one more cell of `template`."""
        return lambda: self.prepare(template)

    async def prepare(
        self,
        template: Template,
        env: dict[str, str] | None = None,
        *,
        sandbox_id: str | None = None,
        workspace: str | None = None,
        resources: dict[str, Any] | None = None,
    ) -> WarmCell:
        """A started and initialised cell, for a new sandbox or (`sandbox_id`, `workspace`) a
        resumed one, with the sandbox's own `resources`; on any failure nothing of the cell
        is left."""
        sandbox_id = sandbox_id or new_sandbox_id()
        policy = await self.images.policy_for(template)
        if resources:
            policy = template.policy_with(policy, resources)
        if env is None:  # a pool's cell: the template's default policy
            env = proxy_env(template.egress_policy())
        try:
            with telemetry.span("cell.start", {"sandcell.template": template.name}):
                handle: CellHandle = await self.backend.create(
                    policy, sandbox_id, self.bootstrap_pem, workspace
                )
        except IsolationUnavailable as exc:
            raise ServiceError(
                ErrorCode.ISOLATION_UNAVAILABLE, str(exc), {"layer": exc.layer}
            ) from exc
        session_key = tokens.generate_p256()
        try:
            with telemetry.span("cell.init", {"sandcell.sandbox_id": sandbox_id}):
                await initialize(
                    handle.endpoint,
                    self.bootstrap_key,
                    sandbox_id,
                    session_key,
                    env,
                    self.init_timeout_s,
                )
        except BaseException as exc:
            if isinstance(exc, InitFailed):
                self.init_failures += 1
            await self.backend.destroy(handle.cell)
            raise
        return WarmCell(sandbox_id, handle, session_key)

    async def set_network(self, record: SandboxRecord, requested: Any) -> SandboxRecord:
        """A live policy change, capped like a create; new connections follow it at once
        (the proxies read the policy from the store on every connection)."""
        with recorded(self.audit, "network.change", record.id) as touched:
            policy = self.template(record.template).network_policy(requested)
            touched["egress"] = policy.egress
            if not await self.store.set_network(record.id, policy.public()):
                raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {record.id} not found")
            if record.state == "running":  # a paused one gets them from its policy at resume
                await self._send_proxy_env(record, policy)
            return dataclasses.replace(record, network=policy.public())

    async def _send_proxy_env(self, record: SandboxRecord, policy: NetworkPolicy) -> None:
        """Later commands get (or lose) the proxy variables of SPEC §11: the daemon's default
        env is rebuilt as at create, `{**proxy_env(policy), **env}`. The policy is in force
        at the proxies already; a daemon that cannot be told is a 502 to retry."""
        pem = await self.store.get_session_key(record.id)
        if pem is None or not record.endpoint:
            return
        env = {**proxy_env(policy), **record.env}
        try:
            await put_default_env(record.endpoint, record.id, tokens.load_private_key(pem), env)
        except httpx.HTTPError as exc:
            raise ServiceError(
                ErrorCode.SANDBOX_UNREACHABLE,
                f"egress {policy.egress!r} is in force, but the sandbox's commands could not be "
                f"given its proxy variables: {exc}",
            ) from exc

    async def delete_sandbox(self, sandbox_id: str, *, wait: bool = True) -> bool:
        """One deletion per sandbox at a time in this process; a second caller waits and then
        finds it gone. Awaited whole by default; with `wait=False` (a user's DELETE) it
        returns once the sandbox is gone for its owner: its cell's processes killed, its
        record "deleted" (hidden, counted by no live limit). The cell's teardown then runs in
        the background; a failure there is logged and retried by the reaper."""
        lock = self._deleting.setdefault(sandbox_id, asyncio.Lock())
        try:
            async with lock:
                record = await self.store.get_sandbox(sandbox_id)
                if record is None or record.state == "deleted":
                    return False
                with recorded(self.audit, "sandbox.delete", sandbox_id):
                    await self.store.update_state(sandbox_id, "deleting")
                    if wait:  # a cancelled caller leaves the teardown going
                        await asyncio.shield(self._tear_down(record))
                    else:
                        self._tear_down(await self._make_unreachable(record))
                return True
        finally:
            if not lock.locked():
                self._deleting.pop(sandbox_id, None)

    async def _make_unreachable(self, record: SandboxRecord) -> SandboxRecord:
        """Nothing of the sandbox runs any more and its owner no longer finds it."""
        if record.cell:
            await self.backend.stop(record.cell)
        gone = dataclasses.replace(record, state="deleted")
        await self.store.transition(gone, ("deleting",))
        return gone

    def _tear_down(self, record: SandboxRecord) -> asyncio.Task[None]:
        """The sandbox's teardown, once per sandbox at a time; `stop` waits for it."""
        task = self._teardowns.get(record.id)
        if task is None:
            task = asyncio.ensure_future(self.forget(record, record.cell))
            self._teardowns[record.id] = task
            task.add_done_callback(lambda t: self._torn_down(record.id, t))
        return task

    def _torn_down(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        del self._teardowns[sandbox_id]
        if not task.cancelled() and task.exception() is not None:
            log.warning("sandbox %s: teardown failed: %r", sandbox_id, task.exception())

    async def retry_teardowns(self, records: list[SandboxRecord]) -> list[str]:
        """Deleted sandboxes whose teardown is not under way (it failed, or this process
        restarted meanwhile) are torn down again (a failure is logged by `_torn_down`)."""
        due = [
            r
            for r in records
            if r.state == "deleted"
            and r.id not in self._teardowns
            and (not r.cell or self.backend.owns(r.cell))
        ]
        for record in due:
            with contextlib.suppress(Exception):  # logged by _torn_down; retried next pass
                await asyncio.shield(self._tear_down(record))
        return [r.id for r in due]

    async def wait_teardowns(self) -> None:
        """Until every teardown under way has ended (graceful shutdown, tests)."""
        while self._teardowns:
            await asyncio.gather(*self._teardowns.values(), return_exceptions=True)

    async def forget(self, record: SandboxRecord, cell: dict[str, Any] | None) -> None:
        """Everything of a sandbox goes: its cell if any, its kept workspace, its record
        (last: until then a restart finds it and finishes the job)."""
        if cell is not None:
            await self.backend.destroy(cell)
        if record.workspace:
            await self.backend.discard_workspace(record.workspace)
        await self.store.delete_sandbox(record.id)

    async def remove_image(self, name: str) -> bool:
        """Deletes a template's built image when no sandbox of the template lives; its warm
        cells go first (they run on it)."""
        template = self.template(name)
        users = await self._image_users(name)
        if users:
            raise ServiceError(
                ErrorCode.CONFLICT,
                f"{len(users)} sandboxes of template {name!r} are running on its image",
                {"sandboxes": users[:20]},
            )
        pool = self.pools[name]
        size = pool.size
        await pool.drain()
        pool.size = size  # refilled once the image is built again
        return await asyncio.to_thread(self.images.remove, template)

    async def _image_users(self, name: str) -> list[str]:
        """The sandboxes of template `name`; deleted ones whose teardown is under way hold
        the image until it ends, so it is awaited first (one that failed still holds it)."""
        records = [r for r in await self.store.list_sandboxes() if r.template == name]
        going = [self._teardowns[r.id] for r in records if r.id in self._teardowns]
        if not going:
            return [r.id for r in records]
        await asyncio.gather(*going, return_exceptions=True)
        return [r.id for r in await self.store.list_sandboxes() if r.template == name]

    # -- expiry and reconciliation (apart: reaper.py, reconcile.py) ------------------------

    @property
    def reap_interval_s(self) -> float:
        return self.reaper.interval_s

    async def reap_once(self, now: float | None = None) -> list[str]:
        """One reaper pass (see `Reaper.reap_once`); the ids it reaped."""
        return await self.reaper.reap_once(now)

    async def reconcile(self) -> dict[str, list[str]]:
        """After a restart: adopt live cells that the store knows, clean up the rest."""
        return await reconcile(self)


def _template_of(requested: str, snapshot: SnapshotRecord | None) -> str:
    """A sandbox from a snapshot runs the snapshot's template (its image and limits made
    the workspace); asking for another one is a 400."""
    if snapshot is None or requested in (snapshot.template, "default"):
        return snapshot.template if snapshot is not None else requested
    raise ServiceError(
        ErrorCode.BAD_REQUEST,
        f"snapshot {snapshot.id} is of template {snapshot.template!r}, not {requested!r}",
        {"snapshot": snapshot.id, "template": snapshot.template},
    )


def within_lifetime(template: Template, **requested: int | None) -> None:
    """A request may shorten the template's lifetime, never extend it (a pod's deadline and
    the operator's capacity plan both follow the template)."""
    for field, value in requested.items():
        if value is not None and value > template.max_lifetime_s:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"{field} may not exceed the template's max_lifetime_s "
                f"({template.max_lifetime_s} s)",
                {"field": field, "limit": template.max_lifetime_s},
            )


async def _each_step(*steps: Callable[[], Awaitable[object]]) -> None:
    """Clean-up: runs every step even when an earlier one fails (each failure is logged; the
    lease of a reservation and the reaper's reconciliation mop up what a failed step left)."""
    for step in steps:
        try:
            await step()
        except Exception as exc:  # typically the store being down: told once by its watch
            log.warning("clean-up after a failed create left work for later: %r", exc)
