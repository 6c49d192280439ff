"""Policy parsing, caps and decisions: every rule of SPEC §11 on its own."""

from __future__ import annotations

import pytest

from sandcell.errors import ServiceError
from sandcell.network.policy import decide, parse_policy, within_cap


def policy(egress: str = "allowlist", allow=(), deny=()):
    return parse_policy({"egress": egress, "allow": list(allow), "deny": list(deny)})


PUBLIC = "93.184.216.34"


@pytest.mark.parametrize(
    "entry",
    [
        "",
        " pypi.org",
        "exa mple.com",
        "*.",
        "a..b",
        "-a.com",
        "10.0.0.0/33",
        "10.0.0.1/8",
        "1.2.3",
        "pypi.org:0",
        "pypi.org:70000",
        "pypi.org:http",
        "[::1",
        "::1/200",
        "*.*.com",
        5,
    ],
)
def test_malformed_entries_are_400_naming_the_entry(entry):
    with pytest.raises(ServiceError) as err:
        policy(allow=[entry])
    assert err.value.status == 400
    assert "allow" in err.value.message
    assert repr(entry)[:20] in err.value.message or str(entry) in str(err.value.details)


@pytest.mark.parametrize(
    "raw",
    [[], "open", {"egress": "wide"}, {"allow": "pypi.org"}, {"egress": "open", "extra": 1}],
)
def test_malformed_policies_are_400(raw):
    with pytest.raises(ServiceError) as err:
        parse_policy(raw)
    assert err.value.status == 400


def test_valid_entries_parse():
    p = policy(
        allow=[
            "pypi.org",
            "*.pythonhosted.org",
            "api.example.com:8443",
            "203.0.113.0/24",
            "2001:db8::1",
            "[2001:db8::1]:443",
            "127.0.0.1:8080",
        ]
    )
    assert [e.port for e in p.allow] == [None, None, 8443, None, None, 443, 8080]
    assert p.public()["allow"][1] == "*.pythonhosted.org"


def test_none_refuses_everything():
    d = decide(policy("none"), "pypi.org", 443, [PUBLIC])
    assert not d.allowed and "none" in d.reason


def test_allowlist_names_and_suffixes_with_default_ports():
    p = policy(allow=["pypi.org", "*.pythonhosted.org"])
    assert decide(p, "pypi.org", 443, [PUBLIC]).allowed
    assert decide(p, "PyPI.org.", 80, [PUBLIC]).allowed
    assert decide(p, "files.pythonhosted.org", 443, [PUBLIC]).allowed
    assert not decide(p, "pythonhosted.org", 443, [PUBLIC]).allowed  # suffix only
    assert not decide(p, "evilpypi.org", 443, [PUBLIC]).allowed
    assert not decide(p, "pypi.org", 22, [PUBLIC]).allowed  # 80 and 443 only
    assert decide(policy(allow=["pypi.org:22"]), "pypi.org", 22, [PUBLIC]).allowed


def test_deny_wins_over_allow():
    p = policy("open", deny=["*.internal.example.com", "198.51.100.0/24"])
    assert not decide(p, "db.internal.example.com", 5432, [PUBLIC]).allowed
    assert not decide(p, "ok.example.com", 443, ["198.51.100.7"]).allowed
    assert decide(p, "ok.example.com", 443, [PUBLIC]).allowed
    both = policy(allow=["a.example.com"], deny=["a.example.com"])
    assert not decide(both, "a.example.com", 443, [PUBLIC]).allowed


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "169.254.169.254",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "224.0.0.1",
    ],
)
def test_internal_addresses_are_refused_even_in_open_mode(address):
    d = decide(policy("open"), "anything.example", 80, [address])
    assert not d.allowed and "host-internal" in d.reason


def test_the_hosts_own_public_address_is_refused():
    assert not decide(
        policy("open"),
        "me.example",
        80,
        [PUBLIC],
        own_addresses=[__import__("ipaddress").ip_address(PUBLIC)],
    ).allowed


def test_an_internal_address_named_by_address_is_allowed():
    p = policy(allow=["127.0.0.1:8080"])
    assert decide(p, "127.0.0.1", 8080, ["127.0.0.1"]).allowed
    assert not decide(p, "127.0.0.1", 8081, ["127.0.0.1"]).allowed
    assert decide(policy("open", allow=["10.0.0.0/8"]), "x", 5432, ["10.2.3.4"]).allowed


def test_a_name_resolving_to_a_refused_address_is_refused():
    """Rebinding: an allowed name that resolves to loopback does not open loopback."""
    d = decide(policy(allow=["localhost:8080"]), "localhost", 8080, ["127.0.0.1"])
    assert not d.allowed and "127.0.0.1" in d.reason


def test_only_checked_addresses_are_handed_out():
    d = decide(policy("open"), "mixed.example", 443, ["10.0.0.1", PUBLIC])
    assert d.allowed and d.addresses == (PUBLIC,)


def test_caps():
    within_cap(policy("allowlist"), "open", internal_allowed=False)
    with pytest.raises(ServiceError) as err:
        within_cap(policy("open"), "allowlist", internal_allowed=False)
    assert err.value.status == 403
    with pytest.raises(ServiceError) as err:
        within_cap(policy(allow=["127.0.0.1:80"]), "open", internal_allowed=False)
    assert err.value.status == 403 and "127.0.0.1:80" in err.value.message
    within_cap(policy(allow=["127.0.0.1:80", "203.0.113.0/24"]), "open", internal_allowed=True)
    within_cap(policy(allow=["203.0.113.0/24"]), "open", internal_allowed=False)
