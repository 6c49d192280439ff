"""Templates and their images (SPEC §12): `Templates.list()`, `.build(name)`, `.remove(name)`.

```python
from sandcell.client.templates import Templates

for t in Templates.list():
    print(t["name"], t["image"]["state"])
image = Templates.build("data", on_event=print)  # admin key; streams progress and log
```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sandcell.client.binding import AsyncBound, SyncBound, classoperation
from sandcell.client.config import ClientConfig, retry_policy
from sandcell.client.errors import InvalidResponseError, SandcellError
from sandcell.client.models import list_in
from sandcell.client.protocol import NDJSON, Invoke, NdjsonDecoder, Op, Read, Request, call_json
from sandcell.client.protocol import call as send

# A first Debian build downloads and unpacks hundreds of packages.
BUILD_READ_TIMEOUT_S = 3600.0
EventCallback = Callable[[dict[str, Any]], Any]


class BuildFailedError(SandcellError):
    """A build step failed; `details` has the step, the message and the log's last lines."""

    default_code = "BUILD_FAILED"


def _path(name: str, rest: str) -> str:
    return f"/v1/templates/{quote(name, safe='')}/{rest}"


class TemplatesBase:
    """Class-level calls only: a template is server configuration, not a client object."""

    @classoperation
    def list(
        cls,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[list[dict[str, Any]]]:
        """Every template: its limits, its image spec and the image's state."""
        request = Request("GET", "/v1/templates")
        data = yield from call_json(request, retry_policy(url, api_key, config))
        return list_in(data, "templates")

    @classoperation
    def build(
        cls,
        name: str,
        on_event: EventCallback | None = None,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[dict[str, Any]]:
        """Build the template's image (admin key) and return its state once ready.

        `on_event` gets each event as it comes: `{"event": "step", "step", "index",
        "total"}`, `{"event": "log", "line"}`. A failed step raises BuildFailedError. An
        unchanged image is a no-op; a build already under way is followed, not repeated."""
        request = Request(
            "POST",
            _path(name, "build"),
            headers={"accept": NDJSON},
            timeout=BUILD_READ_TIMEOUT_S,
            stream=True,
        )
        reply = yield from send(request, retry_policy(url, api_key, config))
        decoder = NdjsonDecoder()
        while True:
            chunk = yield Read(reply.stream)
            for event in decoder.feed(chunk) if chunk else decoder.close():
                if event.get("event") == "done":
                    return dict(event.get("image") or {})
                if event.get("event") == "failed":
                    error = event.get("error") or {}
                    message = f"step {error.get('step')}: {error.get('message')}"
                    raise BuildFailedError(message, details=error)
                if on_event is not None:
                    yield Invoke(on_event, (event,))
            if not chunk:
                raise InvalidResponseError("the build's stream ended without its outcome")

    @classoperation
    def remove(
        cls,
        name: str,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[bool]:
        """Delete the template's image (admin key); ConflictError while sandboxes use it."""
        request = Request("DELETE", _path(name, "image"))
        data = yield from call_json(request, retry_policy(url, api_key, config))
        return bool(data.get("removed")) if isinstance(data, dict) else False


class Templates(SyncBound, TemplatesBase):
    __doc__ = TemplatesBase.__doc__


class AsyncTemplates(AsyncBound, TemplatesBase):
    __doc__ = TemplatesBase.__doc__
