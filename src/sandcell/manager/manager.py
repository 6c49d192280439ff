"""Sandbox lifecycle over a backend and a store: create, claim, init, expire, reconcile."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from sandcell import tokens
from sandcell.cellapi.environment import validate_env
from sandcell.errors import ErrorCode, SandcellError
from sandcell.isolation.policy import IsolationUnavailable
from sandcell.manager.backend import Backend, CellHandle
from sandcell.manager.images import TemplateImages
from sandcell.manager.init import InitFailed, initialize
from sandcell.manager.pool import WarmCell, WarmPool
from sandcell.manager.templates import Template
from sandcell.store import SandboxRecord, Store

log = logging.getLogger("sandcell.manager")

BOOTSTRAP_KEY_NAME = "bootstrap-private-key"
DEFAULT_INIT_TIMEOUT_S = 10.0
DEFAULT_REAP_INTERVAL_S = 5.0
DEAD_AFTER_PROBES = 2


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
    ) -> None:
        self.store = store
        self.images = images or TemplateImages(None)
        self.backend = backend
        self.templates = templates
        self.bootstrap_key = bootstrap_key
        self.bootstrap_pem = tokens.public_pem(bootstrap_key)
        self.init_timeout_s = init_timeout_s
        self.reap_interval_s = reap_interval_s
        self.pools = {
            name: WarmPool(name, t.warm_pool, lambda t=t: self._prepare(t), backend)
            for name, t in templates.items()
        }
        self.init_failures = 0
        self._reaper: asyncio.Task[None] | None = None
        self._deleting: dict[str, asyncio.Lock] = {}
        self._unhealthy: dict[str, int] = {}

    # -- service lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        await self.reconcile()
        self.images.on_ready(lambda _: self._refill_ready_pools())
        self._refill_ready_pools()  # the others fill once their image is built
        self._reaper = asyncio.ensure_future(self._reap_forever())

    def _refill_ready_pools(self) -> None:
        for name, pool in self.pools.items():
            if self.images.ready(self.templates[name]):
                pool.refill()

    async def stop(self) -> None:
        """Stops background work and empties the pools; live sandboxes keep running."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for pool in self.pools.values():
            await pool.drain()
        await asyncio.to_thread(self.images.close)

    # -- sandboxes ------------------------------------------------------------------------

    def template(self, name: str) -> Template:
        if name not in self.templates:
            raise SandcellError(
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
    ) -> SandboxRecord:
        template = self.template(template_name)
        within_lifetime(template, idle_timeout_s=idle_timeout_s, max_lifetime_s=max_lifetime_s)
        env = env or {}
        validate_env(env)  # before any cell is made: the daemon would refuse it at init
        # Pooled cells were initialised before anyone's env was known.
        warm = None if env else await self.pools[template_name].claim()
        if warm is None:
            warm = await self._prepare(template, env)
        now = time.time()
        record = SandboxRecord(
            id=warm.sandbox_id,
            owner=owner,
            template=template_name,
            state="running",
            created_at=now,
            expires_at=now + (max_lifetime_s or template.max_lifetime_s),
            idle_timeout_s=idle_timeout_s or template.idle_timeout_s,
            last_activity_at=now,
            metadata=metadata or {},
            env=env,
            backend=self.backend.name,
            endpoint=warm.handle.endpoint,
            cell=warm.handle.cell,
        )
        try:
            await self.store.put_sandbox(record)
            await self.store.put_session_key(record.id, tokens.private_pem(warm.session_key))
        except BaseException:
            await self.store.delete_sandbox(record.id)
            await self.backend.destroy(warm.handle.cell)
            raise
        return record

    async def _prepare(self, template: Template, env: dict[str, str] | None = None) -> WarmCell:
        """A started and initialised cell; on any failure nothing of it is left."""
        sandbox_id = new_sandbox_id()
        policy = await self.images.policy_for(template)
        try:
            handle: CellHandle = await self.backend.create(policy, sandbox_id, self.bootstrap_pem)
        except IsolationUnavailable as exc:
            raise SandcellError(
                ErrorCode.ISOLATION_UNAVAILABLE, str(exc), {"layer": exc.layer}
            ) from exc
        session_key = tokens.generate_p256()
        try:
            await initialize(
                handle.endpoint,
                self.bootstrap_key,
                sandbox_id,
                session_key,
                env or {},
                self.init_timeout_s,
            )
        except BaseException as exc:
            if isinstance(exc, InitFailed):
                self.init_failures += 1
            await self.backend.destroy(handle.cell)
            raise
        return WarmCell(sandbox_id, handle, session_key)

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """One deletion per sandbox at a time in this process; a second caller waits and then
        finds it gone."""
        lock = self._deleting.setdefault(sandbox_id, asyncio.Lock())
        try:
            async with lock:
                record = await self.store.get_sandbox(sandbox_id)
                if record is None:
                    return False
                await self.store.update_state(sandbox_id, "deleting")
                await self.backend.destroy(record.cell)
                return await self.store.delete_sandbox(sandbox_id)
        finally:
            if not lock.locked():
                self._deleting.pop(sandbox_id, None)

    async def remove_image(self, name: str) -> bool:
        """Deletes a template's built image when no sandbox of the template lives; its warm
        cells go first (they run on it)."""
        template = self.template(name)
        users = [r.id for r in await self.store.list_sandboxes() if r.template == name]
        if users:
            raise SandcellError(
                ErrorCode.CONFLICT,
                f"{len(users)} sandboxes of template {name!r} are running on its image",
                {"sandboxes": users[:20]},
            )
        pool = self.pools[name]
        size = pool.size
        await pool.drain()
        pool.size = size  # refilled once the image is built again
        return await asyncio.to_thread(self.images.remove, template)

    # -- expiry and reconciliation --------------------------------------------------------

    async def reap_once(self, now: float | None = None) -> list[str]:
        """Deletes sandboxes past their idle or lifetime deadline, and those whose daemon
        died."""
        due = await self.store.due_for_reaping(now or time.time(), limit=500)
        due += await self._dead_daemons(set(due))
        for sandbox_id in due:
            await self.delete_sandbox(sandbox_id)
        return due

    async def _dead_daemons(self, skip: set[str]) -> list[str]:
        """Sandboxes whose daemon failed DEAD_AFTER_PROBES health probes in a row (one slow
        answer under load is not a death)."""
        dead, seen = [], set()
        for record in await self.store.list_sandboxes():
            if record.id in skip or record.state != "running":
                continue  # a deletion under way owns it
            seen.add(record.id)
            if await self.backend.healthy(record.endpoint):
                self._unhealthy.pop(record.id, None)
                continue
            self._unhealthy[record.id] = self._unhealthy.get(record.id, 0) + 1
            if self._unhealthy[record.id] >= DEAD_AFTER_PROBES:
                dead.append(record.id)
        for gone in set(self._unhealthy) - seen:
            del self._unhealthy[gone]
        return dead

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            try:
                reaped = await self.reap_once()
            except Exception:
                log.exception("reaper pass failed")
                continue
            if reaped:
                log.info("reaped %d sandboxes", len(reaped))

    async def reconcile(self) -> dict[str, list[str]]:
        """After a restart: adopt live cells that the store knows, clean up the rest."""
        cells = {_key(h.cell): h for h in await self.backend.list()}
        adopted, dropped = [], []
        for record in await self.store.list_sandboxes():
            if not self.backend.owns(record.cell):
                continue  # another replica's cell: that replica reconciles it
            handle = cells.pop(_key(record.cell), None)
            if handle is not None and await self.backend.healthy(handle.endpoint):
                adopted.append(record.id)
                continue
            if handle is not None:
                await self.backend.destroy(handle.cell)
            await self.store.delete_sandbox(record.id)
            dropped.append(record.id)
        for handle in cells.values():  # pool cells and cells whose record never landed
            await self.backend.destroy(handle.cell)
        return {
            "adopted": adopted,
            "dropped": dropped,
            "orphans": [str(_key(h.cell)) for h in cells.values()],
        }


def within_lifetime(template: Template, **requested: int | None) -> None:
    """A request may shorten the template's lifetime, never extend it (a pod's deadline and
    the operator's capacity plan both follow the template)."""
    for field, value in requested.items():
        if value is not None and value > template.max_lifetime_s:
            raise SandcellError(
                ErrorCode.BAD_REQUEST,
                f"{field} may not exceed the template's max_lifetime_s "
                f"({template.max_lifetime_s} s)",
                {"field": field, "limit": template.max_lifetime_s},
            )


def _key(cell: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(cell.items()))
