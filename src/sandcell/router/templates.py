"""Templates and their images (SPEC §12): the list with each image's state, building an image
(admin keys; its progress and log streamed as NDJSON), deleting one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.openapi import Operation
from sandcell.isolation.images.build import BuildJob
from sandcell.router import schemas
from sandcell.router.auth import Principal

NDJSON = "application/x-ndjson"


async def _admin(request: Request) -> Principal:
    principal = await request.app.state.router.principal(request)
    if not principal.admin:
        raise ServiceError(ErrorCode.FORBIDDEN, "building and deleting images needs an admin key")
    return principal


async def list_templates(request: Request) -> Response:
    router = request.app.state.router
    await router.principal(request)
    images, templates = router.manager.images, list(router.manager.templates.values())
    views = await asyncio.to_thread(lambda: [images.view(t) for t in templates])  # file reads
    return JSONResponse({"templates": views})


async def build_template(request: Request) -> Response:
    """200 with one JSON event per line: `step`, `log`, then `done` or `failed`. A build
    already under way (or just finished) is followed, not repeated."""
    await _admin(request)
    manager = request.app.state.router.manager
    template = manager.template(request.path_params["name"])
    job = await asyncio.to_thread(manager.images.build, template)
    return StreamingResponse(_events(job), media_type=NDJSON)


async def _events(job: BuildJob) -> AsyncIterator[bytes]:
    seen = 0
    while True:
        events, done = await asyncio.to_thread(job.wait_events, seen, 1.0)
        seen += len(events)
        for event in events:
            yield json.dumps(event).encode() + b"\n"
        if done and seen == len(job.events):
            return


async def remove_image(request: Request) -> Response:
    await _admin(request)
    manager = request.app.state.router.manager
    name = request.path_params["name"]
    removed = await manager.remove_image(name)
    return JSONResponse({"template": name, "removed": removed})


_TEMPLATE = "/v1/templates/{name}"
OPERATIONS = (
    Operation(
        "GET",
        "/v1/templates",
        list_templates,
        "Templates, their limits and their images' state",
        response=schemas.TemplateList,
    ),
    Operation(
        "POST",
        f"{_TEMPLATE}/build",
        build_template,
        "Build a template's image (admin); progress and log as NDJSON events",
        response=NDJSON,
        errors=(400, 403),
    ),
    Operation(
        "DELETE",
        f"{_TEMPLATE}/image",
        remove_image,
        "Delete a template's image that no sandbox uses (admin)",
        errors=(400, 403, 409),
    ),
)
