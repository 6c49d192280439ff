"""Templates' images as the manager sees them: their state, the policy of a ready one, builds
started on demand (SPEC §12).

Creating a sandbox of a template whose image is not ready is a 409 `TEMPLATE_NOT_READY` with
the build state; an image never built starts building then, in the background (the
code-interpreter template's first use). A failed build is not retried by use, only by an
explicit build: a broken spec should not rebuild on every request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sandcell.errors import ErrorCode, ServiceError
from sandcell.isolation.images.build import Builder, BuildJob
from sandcell.isolation.images.spec import digest
from sandcell.isolation.images.store import ImageState, ImageStore
from sandcell.isolation.policy import CellPolicy
from sandcell.manager.templates import Template

HOST_IMAGE = ImageState("ready")
# Names an image's config may not set: the daemon runs with this environment too, and these
# would change how its loader, interpreter or sandcell itself behave.
RESERVED_ENV_PREFIXES = ("LD_", "PYTHON", "SANDCELL_", "GCONV_", "MALLOC_", "GLIBC_")


def _reserved(name: str) -> bool:
    return name.startswith(RESERVED_ENV_PREFIXES) or name in ("HOME", "LANG")


class TemplateImages:
    """`store` None: this backend does not build images (Kubernetes runs `image.oci`)."""

    def __init__(self, store: ImageStore | None, cgroup_parent: str = "sandcell") -> None:
        self.store = store
        self.builder = Builder(store, cgroup_parent) if store is not None else None
        self._on_ready: list[Callable[[str], object]] = []

    @classmethod
    def under(cls, data_dir: Path) -> TemplateImages:
        return cls(ImageStore(data_dir / "images"))

    def on_ready(self, callback: Callable[[str], None]) -> None:
        """Called, on the calling loop, with a template's name when its build succeeds."""
        loop = asyncio.get_running_loop()
        self._on_ready.append(lambda name: loop.call_soon_threadsafe(callback, name))

    def state(self, template: Template) -> ImageState:
        if not template.image.built or self.store is None:
            return HOST_IMAGE
        image = digest(template.image)
        job = self.builder.job(image) if self.builder else None
        if job is not None and not job.done:
            return ImageState("building", image)
        return self.store.state(image)

    def ready(self, template: Template) -> bool:
        return self.state(template).state == "ready"

    async def policy_for(self, template: Template) -> CellPolicy:
        """`policy` off the event loop when it has files to read (a digest, a mount)."""
        if not template.image.built or self.store is None:
            return template.policy()
        return await asyncio.to_thread(self.policy, template)

    def policy(self, template: Template) -> CellPolicy:
        """The template's cell policy, rooted in its image; 409 until that image is ready."""
        policy = template.policy()
        if not template.image.built or self.store is None:
            return policy
        state = self.state(template)
        if state.state == "absent":
            self.build(template)
            state = self.state(template)
        if state.state != "ready" or state.digest is None:
            raise ServiceError(
                ErrorCode.TEMPLATE_NOT_READY,
                f"the image of template {template.name!r} is {state.state}",
                {"template": template.name, "image": state.public()},
            )
        meta = self.store.meta(state.digest)
        env = {k: v for k, v in (meta.env if meta else {}).items() if not _reserved(k)}
        return replace(
            policy,
            image_root=str(self.store.rootfs(state.digest)),
            image_env=tuple(env.items()),
            inherit_env=(*policy.inherit_env, *(n for n in env if n not in policy.inherit_env)),
        )

    def build(self, template: Template) -> BuildJob:
        if self.builder is None:
            raise ServiceError(ErrorCode.BAD_REQUEST, "this backend does not build images")
        if not template.image.built:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"template {template.name!r} uses the host's system; there is nothing to build",
            )
        job = self.builder.start(template.name, template.image)
        job.when_done(self._built)
        return job

    def _built(self, job: BuildJob) -> None:
        if job.events[-1]["event"] == "done":
            for callback in self._on_ready:
                callback(job.template)

    def close(self) -> None:
        """Unmounts the images (cells still running keep theirs)."""
        if self.store is not None:
            self.store.unmount_all()

    def remove(self, template: Template) -> bool:
        if self.store is None or not template.image.built:
            return False
        return self.store.remove(digest(template.image))

    def view(self, template: Template) -> dict[str, Any]:
        """The template as GET /v1/templates shows it: its limits, its image and state."""
        image = {**template.image.public(), **self.state(template).public()}
        return {**template.public(), "image": image}
