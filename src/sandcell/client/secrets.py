"""Your secrets (SPEC §17): `Secrets.set(name, value, hosts)`, `.list()`, `.delete(name)`.

```python
from sandcell import Sandbox
from sandcell.client.secrets import Secrets

Secrets.set("OPENAI_API_KEY", key, hosts=["api.openai.com"])
with Sandbox.create(secrets=["OPENAI_API_KEY"]) as sbx:  # $OPENAI_API_KEY is a placeholder
    sbx.commands.run("python agent.py")                 # the proxy sends the real key
```
The server never answers a value back: `list()` gives names, hosts, `in` and times.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from sandcell.client.binding import AsyncBound, SyncBound, classoperation
from sandcell.client.config import ClientConfig, retry_policy
from sandcell.client.errors import NotFoundError
from sandcell.client.models import list_in
from sandcell.client.protocol import Op, Request, call_deleted, call_json


def _path(name: str) -> str:
    return f"/v1/secrets/{quote(name, safe='')}"


class SecretsBase:
    """Class-level calls only: a secret belongs to your API key, not to a sandbox."""

    @classoperation
    def set(
        cls,
        name: str,
        value: str,
        hosts: Sequence[str],
        places: Sequence[str] = ("headers",),
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[dict[str, Any]]:
        """Store the secret, or rotate it if `name` exists (new connections of live sandboxes
        use the new value). `places`: where the proxy may substitute it, "headers" and
        optionally "query" and "body" (the API's `in`). Returns it, without its value."""
        body = {"value": value, "hosts": list(hosts), "in": list(places)}
        policy = retry_policy(url, api_key, config)
        try:
            return (yield from call_json(Request("PUT", _path(name), json=body), policy))
        except NotFoundError:
            pass
        create = Request("POST", "/v1/secrets", json={"name": name, **body}, idempotent=False)
        return (yield from call_json(create, policy))

    @classoperation
    def list(
        cls,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[list[dict[str, Any]]]:
        """Your secrets: name, hosts, in, created_at, updated_at (never the value)."""
        data = yield from call_json(
            Request("GET", "/v1/secrets"), retry_policy(url, api_key, config)
        )
        return list_in(data, "secrets")

    @classoperation
    def delete(
        cls,
        name: str,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[bool]:
        """Delete the secret (its placeholders are refused from now on); False if there was
        none by that name."""
        request = Request("DELETE", _path(name))
        return (yield from call_deleted(request, retry_policy(url, api_key, config)))


class Secrets(SyncBound, SecretsBase):
    __doc__ = SecretsBase.__doc__


class AsyncSecrets(AsyncBound, SecretsBase):
    __doc__ = SecretsBase.__doc__
