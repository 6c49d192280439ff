"""The console's session (SPEC §19): a sealed cookie that stands for an API key, and the CSRF
rules that come with a credential the browser sends by itself.

The cookie holds, sealed with AES-GCM under a key kept in the store (so every router replica
opens it), the SHA-256 of the API key, a CSRF token and an expiry; never the key. Each request
looks the key hash up again, so a revoked key's session stops at once, as a Bearer key does.

A cookie goes with every request the browser makes to this host, a forged one included, so a
state-changing call (POST, PUT, PATCH, DELETE) and every WebSocket upgrade made with it must
also carry the session's CSRF token and come from the server's own Origin, and a browser's
navigation is never authenticated by it (`check_fetch_mode`). A page cannot set
headers on a WebSocket, so there the token travels as a subprotocol,
`sandcell.csrf.<token>` beside `sandcell.console` (see `WebSocketToken`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import secrets
import time
import weakref
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.errors import ErrorCode, ServiceError
from sandcell.router.auth import Principal
from sandcell.store import Store
from sandcell.store.crypto import KEY_BYTES, Sealer, StoreCryptoError

COOKIE = "sandcell_session"
CSRF_HEADER = "x-csrf-token"
SUBPROTOCOL = "sandcell.console"  # what the server answers an upgrade that carried a token
TOKEN_PROTOCOL = "sandcell.csrf."  # noqa: S105 - a prefix; the CSRF token follows
SESSION_TTL_S = 12 * 3600
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FETCH_MODES = frozenset({"cors", "same-origin", "websocket"})  # what a page's script makes
_SECRET_NAME = "console-session-key"  # noqa: S105 - a name; sealed in the store, shared by replicas
_AAD = b"sandcell.console.session.v1"
_SCOPE_TOKEN = "sandcell.console.csrf"  # noqa: S105 - scope key for an upgrade's token
_sealers: weakref.WeakKeyDictionary[Store, Sealer] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Session:
    key_hash: str
    csrf: str
    expires_at: int


async def _sealer(store: Store) -> Sealer:
    if (sealer := _sealers.get(store)) is None:
        key = await store.get_secret(_SECRET_NAME)
        if key is None:
            key = await store.put_secret_if_absent(_SECRET_NAME, os.urandom(KEY_BYTES))
        sealer = _sealers[store] = Sealer(key)
    return sealer


async def issue(store: Store, key_hash: str) -> tuple[str, Session]:
    """A new session for the key of `key_hash`: the cookie's value and what it holds."""
    session = Session(key_hash, secrets.token_urlsafe(32), int(time.time()) + SESSION_TTL_S)
    plain = json.dumps({"k": session.key_hash, "c": session.csrf, "e": session.expires_at})
    blob = (await _sealer(store)).seal(plain.encode(), _AAD)
    return base64.urlsafe_b64encode(blob).decode().rstrip("="), session


async def read(store: Store, value: str) -> Session | None:
    """The session a cookie's value holds; None when it is not one of ours or has expired."""
    try:
        blob = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        fields = json.loads((await _sealer(store)).open(blob, _AAD))
        session = Session(str(fields["k"]), str(fields["c"]), int(fields["e"]))
    except (binascii.Error, ValueError, KeyError, TypeError, StoreCryptoError):
        return None
    return session if session.expires_at > time.time() else None


def presented(conn: HTTPConnection, api_key: str | None) -> bool:
    """Whether `conn` authenticates with the console's cookie: it has one and no other key."""
    return api_key is None and "authorization" not in conn.headers and COOKIE in conn.cookies


async def principal(conn: HTTPConnection, store: Store) -> tuple[Principal, Session]:
    """The principal of `conn`'s session cookie, its CSRF token and Origin checked where the
    call changes state; the spec's 401 or 403 otherwise."""
    check_fetch_mode(conn)
    session = await read(store, conn.cookies.get(COOKIE, ""))
    if session is None:
        raise ServiceError(ErrorCode.UNAUTHENTICATED, "the console session is invalid or expired")
    record = await store.get_api_key_by_hash(session.key_hash)
    if record is None or record.revoked:
        raise ServiceError(ErrorCode.UNAUTHENTICATED, "missing, unknown or revoked API key")
    websocket = conn.scope["type"] == "websocket"
    if websocket or conn.scope["method"] in STATE_CHANGING:
        check_origin(conn)
        if websocket:
            check_token(
                conn.scope.get(_SCOPE_TOKEN), session, "a sandcell.csrf.<token> subprotocol"
            )
        else:
            check_token(conn.headers.get(CSRF_HEADER), session, "X-CSRF-Token")
    return Principal(record.principal, record.admin, record.name), session


def check_fetch_mode(conn: HTTPConnection) -> None:
    """403 for what a browser did not fetch from a page's script: a navigation (typed URL,
    link, frame) or an embed. The cookie then never shows a sandbox's own page (a server
    behind one of its ports) at the console's origin, where its script could act as the user.
    Clients that send no Sec-Fetch-Mode (none but browsers do) are not asked."""
    mode = conn.headers.get("sec-fetch-mode")
    if mode is not None and mode not in FETCH_MODES:
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"the console's session works for the page's own calls, not for Sec-Fetch-Mode {mode}",
        )


def check_token(sent: str | None, session: Session, where: str) -> None:
    """403 unless `sent` is `session`'s CSRF token (compared in constant time)."""
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"a console call that changes state needs its CSRF token in {where}",
        )


def own_origin(conn: HTTPConnection) -> str:
    scheme = "https" if conn.url.scheme in ("https", "wss") else "http"
    return f"{scheme}://{conn.headers.get('host', '')}"


def check_origin(conn: HTTPConnection) -> None:
    """403 unless the request's Origin is the server's own (scheme and Host)."""
    origin = conn.headers.get("origin")
    if origin is None or not _same(origin, own_origin(conn)):
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"a console call that changes state must come from {own_origin(conn)}, "
            f"not from {origin or 'no Origin'}",
        )


def _same(a: str, b: str) -> bool:
    x, y = urlsplit(a.lower()), urlsplit(b.lower())
    return (x.scheme, x.netloc) == (y.scheme, y.netloc) and x.path in ("", "/")


class WebSocketToken:
    """Carries a console upgrade's CSRF token out of its subprotocols into the scope (so the
    token never reaches the daemon the upgrade is relayed to) and answers the upgrade with
    `sandcell.console`: a browser that offered subprotocols refuses an answer with none."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        offered = (scope.get("subprotocols") or []) if scope["type"] == "websocket" else []
        if SUBPROTOCOL not in offered:
            await self.app(scope, receive, send)
            return
        tokens = [p[len(TOKEN_PROTOCOL) :] for p in offered if p.startswith(TOKEN_PROTOCOL)]
        ours = {SUBPROTOCOL, *(TOKEN_PROTOCOL + t for t in tokens)}
        rest = [p for p in offered if p not in ours]
        headers = [(k, v) for k, v in scope["headers"] if k != b"sec-websocket-protocol"]
        if rest:
            headers.append((b"sec-websocket-protocol", ", ".join(rest).encode()))
        scope = {
            **scope,
            "subprotocols": rest,
            "headers": headers,
            _SCOPE_TOKEN: tokens[0] if tokens else None,
        }

        async def answer(message: Message) -> None:
            if message["type"] == "websocket.accept" and not message.get("subprotocol"):
                message = {**message, "subprotocol": SUBPROTOCOL}
            await send(message)

        await self.app(scope, receive, answer)
