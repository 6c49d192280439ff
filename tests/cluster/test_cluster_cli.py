"""`sandcell cluster init | issue`: the files each makes, with their modes, and what each
refuses, with its message and exit code."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from sandcell.cli import app
from sandcell.cluster.trust import client_context, server_context


def _run(*args: str | Path):
    return CliRunner().invoke(app, ["cluster", *map(str, args)])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    assert _run("init", root).exit_code == 0
    return root


def test_init_makes_the_ca_key_0600_and_its_certificate_0644(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    done = _run("init", root)
    assert done.exit_code == 0, done.output
    assert done.stdout == f"{root / 'ca.pem'}\n"
    assert sorted(p.name for p in root.iterdir()) == ["ca-key.pem", "ca.pem"]
    assert (_mode(root), _mode(root / "ca-key.pem"), _mode(root / "ca.pem")) == (
        0o700,
        0o600,
        0o644,
    )
    ca = x509.load_pem_x509_certificate((root / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.public_key().curve.name == "secp256r1"
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == 3650  # ten years, and 5 min


def test_init_twice_is_refused_and_keeps_the_first_ca(cluster: Path) -> None:
    before = (cluster / "ca-key.pem").read_bytes(), (cluster / "ca.pem").read_bytes()
    done = _run("init", cluster)
    assert done.exit_code == 1
    assert done.stderr == (
        f"sandcell: {cluster / 'ca-key.pem'} exists: this directory already holds a cluster CA\n"
    )
    assert ((cluster / "ca-key.pem").read_bytes(), (cluster / "ca.pem").read_bytes()) == before


def test_issue_writes_a_member_directory_and_prints_no_key(cluster: Path) -> None:
    done = _run("issue", cluster, "--node", "node-a", "--address", "10.0.0.2", "--dns", "a.local")
    assert done.exit_code == 0, done.output
    member = cluster / "nodes" / "node-a"
    assert done.stdout.startswith(f"{member}\tnode node-a, valid until ")
    assert "PRIVATE KEY" not in done.output
    assert {p.name: _mode(p) for p in member.iterdir()} == {
        "ca.pem": 0o644,
        "cert.pem": 0o644,
        "key.pem": 0o600,
    }
    assert _mode(member) == 0o700
    assert (member / "ca.pem").read_bytes() == (cluster / "ca.pem").read_bytes()
    cert = x509.load_pem_x509_certificate((member / "cert.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in sans] == ["sandcell://node/node-a", "10.0.0.2", "a.local"]
    assert cert.subject.rfc4514_string() == "CN=node-a,OU=node,O=sandcell"
    server_context(member, "node")  # what it made is what a node starts with

    assert _run("issue", cluster, "--router", "r1").exit_code == 0
    client_context(cluster / "routers" / "r1", "router")


def test_reissue_replaces_the_member_whole(cluster: Path) -> None:
    assert _run("issue", cluster, "--node", "n1", "--dns", "n1.local").exit_code == 0
    member = cluster / "nodes" / "n1"
    old = (member / "cert.pem").read_bytes(), (member / "key.pem").read_bytes()
    done = _run("issue", cluster, "--node", "n1", "--dns", "n1.local", "--days", "30")
    assert done.exit_code == 0, done.output
    new = (member / "cert.pem").read_bytes(), (member / "key.pem").read_bytes()
    assert new[0] != old[0] and new[1] != old[1]
    assert [p.name for p in (cluster / "nodes").iterdir()] == ["n1"]  # no leftovers
    server_context(member, "node")


def test_issue_without_a_ca_is_refused(tmp_path: Path) -> None:
    done = _run("issue", tmp_path / "none", "--router", "r1")
    assert done.exit_code == 1
    assert done.stderr == (
        f"sandcell: no cluster CA in {tmp_path / 'none'} (make one with `sandcell cluster init`)\n"
    )
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--node", "Node_A", "--dns", "a.local"],
            "invalid node name 'Node_A': lower-case letters, digits and inner hyphens, "
            "at most 63 (a DNS label)",
        ),
        (["--router", "../r1"], "invalid router name '../r1'"),
        (["--router", "-r"], "invalid router name '-r'"),
        (["--node", "n", "--address", "10.0.0.300"], "--address '10.0.0.300' is not an IP address"),
        (["--node", "n", "--dns", "*.local"], "--dns '*.local' is not a host name"),
        (["--node", "n"], "a node needs at least one --address or --dns"),
        (["--router", "r", "--dns", "r.local"], "--address and --dns name a node"),
    ],
)
def test_bad_arguments_are_refused_by_name(cluster: Path, args: list[str], message: str) -> None:
    done = _run("issue", cluster, *args)
    assert done.exit_code == 1
    assert done.stderr.startswith(f"sandcell: {message}")
    assert not (cluster / "nodes").exists() and not (cluster / "routers").exists()


def test_issue_wants_exactly_one_role(cluster: Path) -> None:
    for args in ([], ["--node", "a", "--router", "b"]):
        done = _run("issue", cluster, *args)
        assert done.exit_code == 2
        assert done.stderr == "sandcell: give exactly one of --node NAME or --router NAME\n"


def test_validity_is_bounded(cluster: Path) -> None:
    for days in ("0", "826"):
        done = _run("issue", cluster, "--router", "r", "--days", days)
        assert done.exit_code == 2
        assert "--days" in done.stderr
