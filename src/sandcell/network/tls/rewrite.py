"""Where a placeholder may become its value, and the rewrites that do it.

`HostRules` holds what one request towards one host may carry: the placeholders of the
secrets that name the host (substituted in headers; in the query and body only where the
secret opts in) and those of every other secret of the sandbox, current or deleted, which
refuse the request. `Rewriter` applies such a table to a byte stream in chunks: a match split
across two chunks is still found, because the bytes at a chunk's end that may begin a key (at
most `len(longest) - 1`) are held back until the next one (or the end) shows how they go on.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from sandcell.secrets.bindings import Decision, SecretBinding

# What a placeholder looks like (SPEC §17): one the sandbox no longer has (a deleted secret,
# or one from before a restart) is still recognised, and refused.
SHAPE = re.compile(rb"sandcell-secret-([A-Za-z_][A-Za-z0-9_]*)-[A-Za-z0-9]+")


class Refusal(Exception):
    """A request that must not go out: `reason` is the proxy's 403 text."""

    def __init__(self, secret: str, decision: Decision, reason: str) -> None:
        super().__init__(reason)
        self.secret = secret
        self.decision = decision
        self.reason = reason


def names_host(hosts: Iterable[str], host: str, port: int) -> bool:
    for entry in hosts:
        if entry.startswith("*.") and host.endswith(entry[1:]):
            return True
        if entry in (host, f"{host}:{port}"):
            return True
    return False


@dataclass(frozen=True)
class Gone:
    """A secret the sandbox had and lost (deleted): its placeholder is refused, not passed."""

    name: str
    placeholder: str
    hosts: frozenset[str]


@dataclass(frozen=True)
class HostRules:
    host: str
    own: tuple[SecretBinding, ...]  # the secrets that name the host
    others: tuple[SecretBinding, ...]  # the sandbox's other secrets
    gone: tuple[Gone, ...] = ()
    was_named: bool = False  # a deleted secret named the host

    @classmethod
    def of(
        cls, bindings: Iterable[SecretBinding], host: str, port: int, gone: Iterable[Gone] = ()
    ) -> HostRules:
        own: list[SecretBinding] = []
        others: list[SecretBinding] = []
        for binding in bindings:
            (own if names_host(binding.hosts, host, port) else others).append(binding)
        gone = tuple(gone)
        was_named = any(names_host(g.hosts, host, port) for g in gone)
        return cls(host, tuple(own), tuple(others), gone, was_named)

    @property
    def intercepts(self) -> bool:
        """Whether connections to the host are terminated here: a secret names it, or did
        (so its placeholder is refused after a deletion, not passed on in a tunnel)."""
        return bool(self.own) or self.was_named

    def _sent_here(self, secret: str, decision: Decision, why: str) -> Refusal:
        """A placeholder sent towards this host that may not be: `why` says why not."""
        message = f"the placeholder of secret {secret!r} was sent towards {self.host}, {why}"
        return Refusal(secret, decision, message)

    def refusal_elsewhere(self, secret: str) -> Refusal:
        return self._sent_here(secret, "refused_host", "a host that secret does not name")

    def refusal_place(self, secret: str, place: str) -> Refusal:
        return Refusal(
            secret,
            "refused_place",
            f"the placeholder of secret {secret!r} is in the request's {place} for {self.host}, "
            f"and that secret is not allowed in the {place} (its `in` lacks {place!r})",
        )

    def refusal_gone(self, secret: str) -> Refusal:
        return self._sent_here(secret, "deleted", "but the sandbox has no such secret (deleted?)")

    def _check_strangers(self, data: bytes) -> None:
        """Refuses the placeholders of secrets that are not the sandbox's (any more)."""
        for binding in self.others:
            if binding.placeholder.encode() in data:
                raise self.refusal_elsewhere(binding.name)
        known = {b.placeholder.encode() for b in self.own + self.others}
        for match in SHAPE.finditer(data):
            if match.group(0) not in known:
                raise self.refusal_gone(match.group(1).decode())

    def head(
        self, target: bytes, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[bytes, list[tuple[bytes, bytes]], set[str]]:
        """The request target and headers with placeholders substituted, and the names of
        the secrets used; raises Refusal for a placeholder that must not go out. Basic
        credentials are looked into too (pip and git send a URL's `user:token` so)."""
        fields = [(name, *_opened(name, value)) for name, value in headers]
        used: set[str] = set()
        self._check_strangers(target)
        for _, value, _ in fields:
            self._check_strangers(value)
        for binding in self.own:
            placeholder, value = binding.placeholder.encode(), binding.value
            if placeholder in target:
                if "query" not in binding.where:
                    raise self.refusal_place(binding.name, "query")
                target = target.replace(placeholder, quote(value, safe="").encode())
                used.add(binding.name)
            for index, (name, field, basic) in enumerate(fields):
                if placeholder in field:
                    fields[index] = (name, field.replace(placeholder, value), basic)
                    used.add(binding.name)
        return target, [(n, _sealed(v) if b else v) for n, v, b in fields], used

    def body(self) -> Rewriter:
        """A request body's rewrite: each placeholder to its value where its secret opts in
        to the body; a refusal for any other."""
        table: dict[bytes, bytes | Refusal] = {}
        for binding in self.others:
            table[binding.placeholder.encode()] = self.refusal_elsewhere(binding.name)
        for gone in self.gone:
            table[gone.placeholder.encode()] = self.refusal_gone(gone.name)
        for binding in self.own:
            placeholder = binding.placeholder.encode()
            if "body" in binding.where:
                table[placeholder] = binding.value
            else:
                table[placeholder] = self.refusal_place(binding.name, "body")
        return Rewriter(table)

    def echo(self) -> Rewriter:
        """A response's rewrite: any secret's value back to its placeholder."""
        return Rewriter({b.value: b.placeholder.encode() for b in self.own + self.others})

    def echo_head(self, headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        out = []
        for name, value in headers:
            for binding in self.own + self.others:
                if binding.value and binding.value in value:
                    value = value.replace(binding.value, binding.placeholder.encode())
            out.append((name, value))
        return out

    def any_length_change(self) -> bool:
        """Whether an echo replaced in a response body would change its length."""
        return any(len(b.value) != len(b.placeholder) for b in self.own + self.others)


_BASIC = b"basic "
_CREDENTIALS = (b"authorization", b"proxy-authorization")


def _opened(name: bytes, value: bytes) -> tuple[bytes, bool]:
    """A header's value as substitution sees it: Basic credentials decoded (True)."""
    if name.lower() in _CREDENTIALS and value[:6].lower() == _BASIC:
        try:
            return base64.b64decode(value[6:].strip(), validate=True), True
        except binascii.Error:
            pass
    return value, False


def _sealed(credentials: bytes) -> bytes:
    return b"Basic " + base64.b64encode(credentials)


class Rewriter:
    """Replaces each key of `table` by its bytes in a stream fed in chunks; a key mapped to a
    Refusal raises it. `used` collects the keys replaced."""

    def __init__(self, table: dict[bytes, bytes | Refusal]) -> None:
        self.table = {key: out for key, out in table.items() if key}
        self.keep = max(map(len, self.table), default=1) - 1
        self.held = b""
        self.used: set[bytes] = set()

    def __bool__(self) -> bool:
        return bool(self.table)

    def feed(self, chunk: bytes | bytearray) -> bytes:
        return b"".join(self.parts(chunk))

    def parts(
        self, chunk: bytes | bytearray, end: int | None = None
    ) -> list[bytes | bytearray | memoryview]:
        """`feed`'s output as the pieces to send in order: where nothing matches, views of
        `chunk` (no copy of a bulk chunk; whoever hands it in must not change it until they
        are sent). Only `chunk[:end]` is read, so a fixed buffer can be handed in as is."""
        end = len(chunk) if end is None else end
        if not self.table:
            return [] if not end else [chunk] if end == len(chunk) else [memoryview(chunk)[:end]]
        held = self.held
        out: list[bytes | bytearray | memoryview] = []
        data = chunk
        if held:
            # A match that starts in what was held ends within `keep` bytes of this chunk:
            # only if one may is the chunk joined to it (a copy) to be scanned as one.
            window = held + chunk[: min(self.keep, end)]
            if end < self.keep or any(key in window for key in self.table):
                data = held + chunk[:end]
                end = len(data)
            else:
                out.append(held)
        view = memoryview(data)
        pos = 0
        while True:
            found, key = -1, b""
            for candidate in self.table:
                index = data.find(candidate, pos, end)
                if index >= 0 and (found < 0 or index < found):
                    found, key = index, candidate
            if found < 0:
                break
            replacement = self.table[key]
            if isinstance(replacement, Refusal):
                raise replacement
            if found > pos:
                out.append(view[pos:found])
            out.append(replacement)
            self.used.add(key)
            pos = found + len(key)
        hold = self._hold_from(data, pos, end)
        if hold > pos:
            out.append(view[pos:hold])
        self.held = bytes(view[hold:end])
        return out

    def _hold_from(self, data: bytes | bytearray, pos: int, end: int) -> int:
        """Where the bytes at the end of `data[:end]` (past `pos`) that may begin a key begin:
        they wait for the next chunk. Any other byte cannot be part of a match."""
        hold = end
        for key in self.table:
            first = key[:1]
            at = data.find(first, max(pos, end - len(key) + 1), end)
            while 0 <= at < hold:
                if key.startswith(data[at:end]):
                    hold = at
                    break
                at = data.find(first, at + 1, end)
        return hold

    def flush(self) -> bytes:
        """The bytes held back, once the stream has ended (no match can complete now)."""
        held, self.held = self.held, b""
        return held
