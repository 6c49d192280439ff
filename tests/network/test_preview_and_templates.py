"""Preview tokens (forgery, tampering, expiry) and the templates' network keys."""

from __future__ import annotations

import pytest

from sandcell.errors import ServiceError
from sandcell.manager.templates import ConfigError, parse_templates
from sandcell.network.preview import PreviewSigner, new_key

SIGNER = PreviewSigner(new_key())


def test_a_genuine_token_verifies_until_it_expires():
    token = SIGNER.mint("sbx-0123abcd", 8000, 2_000)
    assert SIGNER.verify(token, now=1_999) == ("sbx-0123abcd", 8000)
    assert SIGNER.verify(token, now=2_000) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("sbx-0123abcd", "sbx-0123abce"),  # another sandbox
        lambda t: t.replace(".8000.", ".8001."),  # another port
        lambda t: t.replace(".2000.", ".9999."),  # a later expiry
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # another MAC
        lambda t: PreviewSigner(new_key()).mint("sbx-0123abcd", 8000, 2_000),  # another key
        lambda t: t + "x",
        lambda t: "",
        lambda t: "../../etc",
    ],
)
def test_forged_or_altered_tokens_are_refused(change):
    assert SIGNER.verify(change(SIGNER.mint("sbx-0123abcd", 8000, 2_000)), now=1_000) is None


def test_template_network_keys_are_checked_at_start_up():
    templates = parse_templates(
        {"templates": {"t": {"network": "allowlist", "network_allow": ["pypi.org"]}}}
    )
    assert templates["t"].egress_policy().public()["allow"] == ["pypi.org"]
    legacy = parse_templates({"templates": {"t": {"network": "loopback"}}})["t"]
    assert legacy.network == "none"
    with pytest.raises(ConfigError, match="bad host"):
        parse_templates({"templates": {"t": {"network_deny": ["bad host"]}}})
    with pytest.raises(ConfigError, match="wider than network_max"):
        parse_templates({"templates": {"t": {"network": "open"}}})
    with pytest.raises(ConfigError, match="network_max"):
        parse_templates({"templates": {"t": {"network_max": "everything"}}})


def test_a_request_is_capped_by_its_template():
    t = parse_templates({"templates": {"t": {"network_max": "allowlist"}}})["t"]
    assert t.network_policy(None).egress == "none"
    assert t.network_policy({"allow": ["pypi.org"]}).egress == "allowlist"
    with pytest.raises(ServiceError) as err:
        t.network_policy({"egress": "open"})
    assert err.value.status == 403
