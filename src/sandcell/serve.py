"""`sandcell serve`: router + manager in one process; local cells or Kubernetes pods."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator

import uvicorn

from sandcell.manager.backend import Backend, LocalBackend
from sandcell.manager.images import TemplateImages
from sandcell.manager.manager import Manager, load_bootstrap_key
from sandcell.router.app import Limits, Router, create_app
from sandcell.settings import Settings
from sandcell.store import Sealer, Store, load_store_key, open_store


@contextlib.asynccontextmanager
async def opened_store(settings: Settings) -> AsyncIterator[Store]:
    settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = open_store(settings.store_url, Sealer(load_store_key(settings.data_dir)))
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def opened_backend(settings: Settings) -> AsyncIterator[Backend]:
    if settings.backend == "local":
        yield LocalBackend(settings.cells_dir)
        return
    from sandcell.manager.k8s.backend import KubernetesBackend  # lightkube only when used

    backend = KubernetesBackend(settings.kubernetes, settings.templates)
    try:
        yield backend
    finally:
        await backend.aclose()


KEEP_ALIVE_S = 75


class JsonFormatter(logging.Formatter):
    FIELDS = ("request_id", "status", "route", "duration_ms")

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: getattr(record, k) for k in self.FIELDS if hasattr(record, k)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(log_format: str) -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("sandcell")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


async def serve(settings: Settings) -> None:
    configure_logging(settings.log_format)
    async with opened_store(settings) as store, opened_backend(settings) as backend:
        manager = Manager(
            store,
            backend,
            settings.templates,
            await load_bootstrap_key(store),
            init_timeout_s=settings.init_timeout_s,
            reap_interval_s=settings.reap_interval_s,
            images=TemplateImages.under(settings.data_dir) if settings.backend == "local" else None,
        )
        limits = Limits(settings.max_inflight, settings.max_sandboxes_per_key)
        app = create_app(Router(store, manager, limits))
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
            lifespan="on",
            # Longer than any client's idle pool timeout: a server closing an idle keep-alive
            # connection while a client reuses it loses that request (httpx keeps 5 s).
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        await uvicorn.Server(config).serve()
