"""Egress policies (SPEC §11): parsing, the cap a template sets, and the per-connection decision.

A policy is `{"egress": "none"|"allowlist"|"open", "allow": [...], "deny": [...]}`. An entry is a
host name (exact, or `*.suffix`), an IP address or a CIDR, each optionally with `:port`
(`[v6]:port` for IPv6). Decisions are made on the addresses the proxy resolved itself, and the
proxy then connects only to an address that passed: a name cannot be re-resolved elsewhere
between the check and the connection (no DNS rebinding). Addresses and entries are normalised
first (`normalise`): `::ffff:127.0.0.1` is 127.0.0.1 to the kernel, so it is to the policy too.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sandcell.errors import ErrorCode, ServiceError

Mode = Literal["none", "allowlist", "open"]
MODES: tuple[Mode, ...] = ("none", "allowlist", "open")  # narrowest first
MAX_ENTRIES = 256
ALLOWLIST_DEFAULT_PORTS = frozenset({80, 443})
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_BRACKETED = re.compile(r"^\[([0-9a-fA-F:.]+)\](?::(\d+))?$")


@dataclass(frozen=True)
class Entry:
    """One allow or deny entry: a name pattern or a network, and a port or None (any)."""

    text: str
    name: str | None = None  # lower-case; "*.example.com" matches any subdomain
    network: IPNetwork | None = None
    port: int | None = None

    def matches_name(self, host: str) -> bool:
        if self.name is None:
            return False
        if self.name.startswith("*."):
            return host.endswith(self.name[1:])
        return host == self.name

    def matches_address(self, address: IPAddress) -> bool:
        return self.network is not None and address in self.network


@dataclass(frozen=True)
class NetworkPolicy:
    egress: Mode = "none"
    allow: tuple[Entry, ...] = ()
    deny: tuple[Entry, ...] = ()

    def public(self) -> dict[str, Any]:
        return {
            "egress": self.egress,
            "allow": [e.text for e in self.allow],
            "deny": [e.text for e in self.deny],
        }

    def internal_entries(self) -> list[str]:
        """Allow entries that name a refused-by-default address (loopback, private, ...)."""
        return [e.text for e in self.allow if e.network is not None and _is_internal_net(e.network)]


NONE = NetworkPolicy()


def bad(message: str, **details: Any) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, message, details)


def parse_policy(raw: Any, where: str = "network") -> NetworkPolicy:
    """A policy from its JSON form; malformed input is a 400 naming the entry."""
    if raw is None:
        return NONE
    if isinstance(raw, NetworkPolicy):
        return raw
    if not isinstance(raw, dict):
        raise bad(f"{where} must be an object", field=where)
    unknown = set(raw) - {"egress", "allow", "deny"}
    if unknown:
        raise bad(f"{where}: unknown fields {sorted(unknown)}", field=where)
    egress = raw.get("egress", "allowlist" if raw.get("allow") else "none")
    if egress not in MODES:
        raise bad(f"{where}.egress must be one of {list(MODES)}", field=f"{where}.egress")
    return NetworkPolicy(
        egress,
        _entries(raw.get("allow", []), f"{where}.allow"),
        _entries(raw.get("deny", []), f"{where}.deny"),
    )


def _entries(raw: Any, where: str) -> tuple[Entry, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise bad(f"{where} must be a list of at most {MAX_ENTRIES} strings", field=where)
    return tuple(parse_entry(item, where) for item in raw)


def parse_entry(text: Any, where: str = "entry") -> Entry:
    if not isinstance(text, str) or not text or len(text) > 300 or text != text.strip():
        raise bad(f"{where}: invalid entry {text!r}", field=where, entry=str(text)[:300])
    host, port = _split_port(text, where)
    try:
        network = ipaddress.ip_network(host, strict=True)
        return Entry(text, network=normalise_network(network), port=port)
    except ValueError as exc:
        if "/" in host or ":" in host or host.replace(".", "").isdigit():
            raise bad(
                f"{where}: invalid address {text!r}: {exc}", field=where, entry=text
            ) from None
    name = host.lower().rstrip(".")
    labels = name[2:].split(".") if name.startswith("*.") else name.split(".")
    if not all(_LABEL.match(label) for label in labels) or len(name) > 253:
        raise bad(f"{where}: invalid host name {text!r}", field=where, entry=text)
    return Entry(text, name=name, port=port)


def _split_port(text: str, where: str) -> tuple[str, int | None]:
    if m := _BRACKETED.match(text):
        return m.group(1), _port(m.group(2), text, where)
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _port(port, text, where)
    return text, None  # no port, or a bare IPv6 address


def _port(text: str | None, entry: str, where: str) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise bad(f"{where}: invalid port in {entry!r}", field=where, entry=entry)
    return int(text)


# -- caps -----------------------------------------------------------------------------------


def within_cap(policy: NetworkPolicy, network_max: Mode, internal_allowed: bool) -> None:
    """A request may narrow the template's widest policy, never widen it: 403 beyond."""
    if MODES.index(policy.egress) > MODES.index(network_max):
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"egress {policy.egress!r} is wider than this template allows ({network_max!r})",
            {"egress": policy.egress, "network_max": network_max},
        )
    internal = policy.internal_entries()
    if internal and not internal_allowed:
        raise ServiceError(
            ErrorCode.FORBIDDEN,
            f"allow entry {internal[0]!r} names a host-internal address, which this template "
            "does not let requests open (network_internal)",
            {"entry": internal[0]},
        )


# -- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    addresses: tuple[str, ...] = field(default=())  # the checked addresses to connect to


def normalise(address: IPAddress) -> IPAddress:
    """The address the kernel connects to: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
    `::ffff:7f00:1`) is its IPv4 address, and a zone (`%eth0`) is dropped, so no spelling of
    an address slips past an entry or a range that names it the usual way."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(int(address))
    return address


def canonical_host(host: str) -> str:
    """`host` as the proxies check and log it: an IP literal in its normal form, else as is."""
    try:
        return str(normalise(ipaddress.ip_address(host)))
    except ValueError:
        return host


def normalise_network(network: IPNetwork) -> IPNetwork:
    """A network inside `::ffff:0:0/96` as the IPv4 network it maps (see `normalise`)."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        v4 = ipaddress.IPv4Address(int(network.network_address) & 0xFFFFFFFF)
        return ipaddress.IPv4Network((v4, network.prefixlen - 96))
    return network


def decide(
    policy: NetworkPolicy,
    host: str,
    port: int,
    addresses: Sequence[str],
    own_addresses: Iterable[IPAddress] = (),
) -> Decision:
    """Whether a connection to `host:port` (resolved by the proxy to `addresses`) may go,
    and to which of those addresses."""
    if policy.egress == "none":
        return Decision(False, "egress is 'none' for this sandbox")
    host = canonical_host(host.lower().rstrip("."))
    if denied := _first(policy.deny, host, port, None, any_port=True):
        return Decision(False, f"{host}:{port} matches deny entry {denied.text!r}")
    own = {normalise(a) for a in own_addresses}
    passed: list[str] = []
    reason = f"{host} did not resolve"
    for text in addresses:
        address = normalise(ipaddress.ip_address(text))
        verdict = _address_verdict(policy, host, port, address, own)
        if verdict is None:
            passed.append(str(address))  # connect to the form that was checked
        else:
            reason = verdict
    if passed:
        return Decision(True, "allowed", tuple(passed))
    return Decision(False, reason)


def _address_verdict(
    policy: NetworkPolicy, host: str, port: int, address: IPAddress, own: set[IPAddress]
) -> str | None:
    """None when `address` (normalised) may be used for this connection, else why not."""
    if denied := _first(policy.deny, None, port, address, any_port=True):
        return f"{address}:{port} matches deny entry {denied.text!r}"
    open_mode = policy.egress == "open"
    named = _first(policy.allow, None, port, address, any_port=open_mode)
    if _is_internal(address, own) and named is None:
        return (
            f"{host} resolves to {address}, a host-internal address that no allow entry "
            "names by address"
        )
    if open_mode or named is not None:
        return None
    if _first(policy.allow, host, port, None, any_port=False) is not None:
        return None
    return f"{host}:{port} is not in the allow list"


def _first(
    entries: Iterable[Entry], host: str | None, port: int, address: IPAddress | None, any_port: bool
) -> Entry | None:
    for entry in entries:
        if not _port_matches(entry, port, any_port):
            continue
        if host is not None and entry.matches_name(host):
            return entry
        if address is not None and entry.matches_address(address):
            return entry
    return None


def _port_matches(entry: Entry, port: int, any_port: bool) -> bool:
    if entry.port is not None:
        return entry.port == port
    return any_port or port in ALLOWLIST_DEFAULT_PORTS


# Refused even in "open" mode unless an allow entry names them by address: this host, its
# neighbours, the cloud metadata endpoint (169.254.169.254), and addresses with no public meaning.
INTERNAL_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/96",  # unspecified, loopback, IPv4-compatible (deprecated)
        "::ffff:0:0/96",  # IPv4-mapped: checked as IPv4 (`normalise`); a wider entry is internal
        "64:ff9b::/96",  # NAT64: a translator would reach the IPv4 address it embeds
        "64:ff9b:1::/48",  # NAT64 for local use
        "100::/64",  # discard-only
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
)


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _is_internal(address: IPAddress, own: Iterable[IPAddress] = ()) -> bool:
    """Loopback, private, ... or this host's own (`own`, normalised), in any spelling."""
    address = normalise(address)
    if address in own:
        return True
    if isinstance(address, ipaddress.IPv6Address):
        # 6to4 and Teredo carry an IPv4 address that a relay would send the packets to.
        embedded = [address.sixtofour, *(address.teredo or ())]
        if any(v4 is not None and _is_internal(v4, own) for v4 in embedded):
            return True
    return any(address in net for net in INTERNAL_NETWORKS if net.version == address.version)


def _is_internal_net(network: IPNetwork) -> bool:
    return any(
        network.overlaps(net)  # type: ignore[arg-type]
        for net in INTERNAL_NETWORKS
        if net.version == network.version
    )
