"""The table of E2B's control API (`OPERATIONS`): each route, its handler wrapped once by
`_secured`, and what /openapi.json says of it.
"""

from __future__ import annotations

from typing import Any

from sandcell.compat.e2b import errors
from sandcell.compat.e2b.control.common import Handler
from sandcell.compat.e2b.control.keys import SECURITY, _secured
from sandcell.compat.e2b.control.lifecycle import pause, resume
from sandcell.compat.e2b.control.listing import MAX_PAGE
from sandcell.compat.e2b.control.metrics import metrics
from sandcell.compat.e2b.control.models import (
    Created,
    ForkRequest,
    NetworkUpdate,
    NewSandbox,
    NewSecret,
    Secret,
    SecretUpdate,
    SnapshotRequest,
    Timeout,
)
from sandcell.compat.e2b.control.network import update_network
from sandcell.compat.e2b.control.sandboxes import (
    connect,
    create,
    describe,
    kill,
    list_sandboxes,
    set_timeout,
)
from sandcell.compat.e2b.control.secrets import (
    create_secret,
    delete_secret,
    get_secret,
    list_secrets,
    update_secret,
)
from sandcell.compat.e2b.control.snapshots import (
    create_snapshot,
    delete_snapshot,
    fork,
    list_snapshots,
)
from sandcell.http.openapi import Operation, Query

_SBX = "/sandboxes/{sandbox_id}"
_BY_ID = "/secrets/{secret_id}"

_LIST_QUERY = (
    Query("metadata", {"type": "string"}, description="urlencoded k=v pairs"),
    Query("state", {"type": "string"}, description="running,paused"),
    Query("template", {"type": "string"}),
    Query("startedAfter", {"type": "string"}, description="RFC 3339"),
    Query("order", {"type": "string"}, description="desc (default: newest first) or asc, by start"),
    Query("limit", {"type": "integer"}, description=f"at most {MAX_PAGE}; absent: all"),
    Query("nextToken", {"type": "string"}, description="from X-Next-Token"),
)

_METRICS_QUERY = (
    Query("start", {"type": "integer"}, description="Unix seconds"),
    Query("end", {"type": "integer"}, description="Unix seconds"),
)

_PAGE_QUERY = (
    Query("limit", {"type": "integer"}, description=f"at most {MAX_PAGE}; absent: all"),
    Query("nextToken", {"type": "string"}, description="from X-Next-Token"),
)

_SNAP_QUERY = (
    Query("sandboxID", {"type": "string"}, description="snapshots of this sandbox"),
    Query("name", {"type": "string"}),
    Query("limit", {"type": "integer"}, description=f"at most {MAX_PAGE}"),
    Query("nextToken", {"type": "string"}, description="from X-Next-Token"),
)


def _op(method: str, path: str, handler: Handler, summary: str, **kw: Any) -> Operation:
    name = (path.strip("/").split("/")[0] + "_" if path.startswith("/v2/") else "") + (
        handler.__name__
    )
    errors_ = tuple(sorted({401, 404, 429, *kw.pop("errors", ())}))
    return Operation(
        method,
        path,
        _secured(name, handler),
        f"E2B control: {summary}",
        errors=errors_,
        security=SECURITY,
        error_body=errors.RestError,
        **kw,
    )


OPERATIONS = (
    *(
        _op(
            "POST",
            f"{v}/sandboxes",
            create,
            "create a sandbox",
            body=NewSandbox,
            response=Created,
            status=201,
            errors=(403, 409, 413, 503),
        )
        for v in ("", "/v2")
    ),
    *(
        _op("GET", f"{v}/sandboxes", list_sandboxes, "list your sandboxes", query=_LIST_QUERY)
        for v in ("", "/v2")
    ),
    _op("GET", _SBX, describe, "describe a sandbox"),
    _op("DELETE", _SBX, kill, "kill a sandbox", status=204),
    _op("POST", f"{_SBX}/timeout", set_timeout, "set the timeout", body=Timeout, status=204),
    *(
        _op(
            "POST",
            f"{v}{_SBX}/connect",
            connect,
            "connect (a paused sandbox resumes; the timeout extends)",
            body=Timeout,
            response=Created,
            errors=(409,),
        )
        for v in ("", "/v2")
    ),
    _op(
        "GET",
        f"{_SBX}/metrics",
        metrics,
        "the metrics samples of a range",
        query=_METRICS_QUERY,
        errors=(400, 501),
    ),
    _op(
        "PUT",
        f"{_SBX}/network",
        update_network,
        "replace the egress policy (SPEC §11)",
        body=NetworkUpdate,
        status=204,
        errors=(400, 403),
    ),
    _op(
        "POST",
        f"{_SBX}/snapshots",
        create_snapshot,
        "snapshot the files (SPEC §13)",
        body=SnapshotRequest,
        status=201,
        errors=(400, 409, 413, 501),
    ),
    _op("GET", "/snapshots", list_snapshots, "list your snapshots", query=_SNAP_QUERY),
    _op(
        "DELETE",
        "/templates/{template_id}",
        delete_snapshot,
        "delete a snapshot (E2B's snapshots are templates)",
        status=204,
    ),
    _op(
        "POST",
        f"{_SBX}/fork",
        fork,
        "fork: one snapshot, count sandboxes from it",
        body=ForkRequest,
        status=201,
        errors=(400, 409, 501),
    ),
    _op("POST", f"{_SBX}/pause", pause, "pause (files kept)", status=204, errors=(409,)),
    _op(
        "POST",
        f"{_SBX}/resume",
        resume,
        "resume a paused sandbox",
        response=Created,
        status=201,
        errors=(409,),
    ),
    # SPEC §17: the principal's secrets, sandcell's store (see control/secrets.py)
    _op(
        "POST",
        "/secrets",
        create_secret,
        "store a secret (metadata.hosts: where its value may go)",
        body=NewSecret,
        response=Secret,
        status=201,
        errors=(400, 409, 413),
    ),
    _op("GET", "/secrets", list_secrets, "list your secrets (never values)", query=_PAGE_QUERY),
    _op("GET", _BY_ID, get_secret, "a secret by id or name", response=Secret, errors=(400,)),
    _op(
        "POST",
        _BY_ID,
        update_secret,
        "a secret's new value (and hosts)",
        body=SecretUpdate,
        response=Secret,
        errors=(400, 413),
    ),
    _op("DELETE", _BY_ID, delete_secret, "delete a secret", status=204, errors=(400,)),
)
