"""Mutual TLS between routers and nodes (SPEC §18), over real handshakes on loopback: a node's
API admits only routers of its own cluster, a router trusts only nodes of its own cluster under
the name it dialled, and a member whose own files are wrong refuses to start."""

from __future__ import annotations

import datetime
import shutil
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandcell.cluster.trust import (
    TrustError,
    client_context,
    init,
    issue,
    load_member,
    server_context,
)

TIMEOUT = 5.0


@dataclass
class Cluster:
    root: Path
    node: Path
    router: Path


def _cluster(root: Path) -> Cluster:
    init(root)
    node = issue(root, "node", "node-a", addresses=["127.0.0.1"], dns_names=["node-a.local"])
    return Cluster(root, node, issue(root, "router", "r1"))


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return _cluster(tmp_path_factory.mktemp("ours"))


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return _cluster(tmp_path_factory.mktemp("theirs"))


@dataclass
class Outcome:
    server_error: Exception | None = None
    client_error: Exception | None = None
    client_peer: dict | None = None  # what each side saw of the other, when it got that far
    server_peer: dict | None = None
    version: str | None = None

    @property
    def accepted(self) -> bool:
        return self.server_error is None and self.client_error is None


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> Outcome:
    """One connection over 127.0.0.1: the server answers b"ok" once the handshake is done; the
    client reads it (under TLS 1.3 a server's refusal of the client's certificate reaches the
    client as an alert on its first read, after its own side of the handshake finished)."""
    outcome = Outcome()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(TIMEOUT)

    def answer() -> None:
        try:
            conn, _ = listener.accept()
            conn.settimeout(TIMEOUT)
            with server.wrap_socket(conn, server_side=True) as tls:
                outcome.server_peer = tls.getpeercert()
                tls.sendall(b"ok")
        except (OSError, ssl.SSLError) as exc:
            outcome.server_error = exc

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        raw = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        with client.wrap_socket(raw, server_hostname=host) as tls:
            outcome.client_peer = tls.getpeercert()
            outcome.version = tls.version()
            if tls.recv(2) != b"ok":
                raise ConnectionError("the server closed without answering")
    except (OSError, ssl.SSLError) as exc:
        outcome.client_error = exc
    finally:
        thread.join(TIMEOUT)
        listener.close()
    assert not thread.is_alive()
    return outcome


def _by_hand(
    directory: Path | None, protocol: int, trust: Path, **versions: ssl.TLSVersion
) -> ssl.SSLContext:
    """A context made straight from files, without the checks of sandcell's own: what a
    peer that does not play by the rules would present."""
    context = ssl.SSLContext(protocol)
    context.load_verify_locations(trust)
    if protocol == ssl.PROTOCOL_TLS_SERVER:
        context.verify_mode = ssl.CERT_REQUIRED
    for name, version in versions.items():
        setattr(context, name, version)
    if directory is not None:
        context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    return context


def _uris(peer: dict | None) -> list[str]:
    return [v for k, v in (peer or {}).get("subjectAltName", ()) if k == "URI"]


def _reason(exc: Exception | None) -> str:
    return str(getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc)


def test_a_router_reaches_a_node_over_tls13_both_named(ours: Cluster) -> None:
    done = _handshake(
        server_context(ours.node, "node"), client_context(ours.router, "router"), "127.0.0.1"
    )
    assert done.accepted, done
    assert done.version == "TLSv1.3"
    assert _uris(done.server_peer) == ["sandcell://router/r1"]
    assert _uris(done.client_peer) == ["sandcell://node/node-a"]


def test_a_node_is_also_reached_by_its_dns_name(ours: Cluster) -> None:
    done = _handshake(
        server_context(ours.node, "node"), client_context(ours.router, "router"), "node-a.local"
    )
    assert done.accepted, done


def test_a_client_without_a_certificate_is_refused(ours: Cluster) -> None:
    anonymous = _by_hand(None, ssl.PROTOCOL_TLS_CLIENT, ours.root / "ca.pem")
    done = _handshake(server_context(ours.node, "node"), anonymous, "127.0.0.1")
    assert _reason(done.server_error) == "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    assert done.client_error is not None


def test_a_router_of_another_cluster_is_refused(ours: Cluster, theirs: Cluster) -> None:
    # It trusts our CA, so that it is our node that refuses (its own would refuse us first).
    foreign = _by_hand(theirs.router, ssl.PROTOCOL_TLS_CLIENT, ours.root / "ca.pem")
    done = _handshake(server_context(ours.node, "node"), foreign, "127.0.0.1")
    assert _reason(done.server_error) == "unable to get local issuer certificate"
    assert done.client_error is not None


def test_a_node_of_another_cluster_is_not_trusted_by_a_router(
    ours: Cluster, theirs: Cluster
) -> None:
    foreign = _by_hand(theirs.node, ssl.PROTOCOL_TLS_SERVER, ours.root / "ca.pem")
    done = _handshake(foreign, client_context(ours.router, "router"), "127.0.0.1")
    assert _reason(done.client_error) == "unable to get local issuer certificate"


def test_a_node_certificate_presented_by_a_client_is_refused(ours: Cluster) -> None:
    posing = _by_hand(ours.node, ssl.PROTOCOL_TLS_CLIENT, ours.root / "ca.pem")
    done = _handshake(server_context(ours.node, "node"), posing, "127.0.0.1")
    assert _reason(done.server_error) == "unsuitable certificate purpose"
    assert done.client_error is not None


def test_a_router_certificate_presented_by_a_server_is_refused(ours: Cluster) -> None:
    posing = _by_hand(ours.router, ssl.PROTOCOL_TLS_SERVER, ours.root / "ca.pem")
    done = _handshake(posing, client_context(ours.router, "router"), "127.0.0.1")
    assert _reason(done.client_error) == "unsuitable certificate purpose"


def test_an_expired_certificate_is_refused(ours: Cluster, tmp_path: Path) -> None:
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    stale = issue(ours.root, "router", "stale", validity=datetime.timedelta(days=1), now=long_ago)
    posing = _by_hand(stale, ssl.PROTOCOL_TLS_CLIENT, ours.root / "ca.pem")
    done = _handshake(server_context(ours.node, "node"), posing, "127.0.0.1")
    assert _reason(done.server_error) == "certificate has expired"
    with pytest.raises(TrustError, match=r"cert\.pem expired on "):
        client_context(stale, "router")  # and sandcell's own router would not start with it


def test_a_name_the_node_certificate_does_not_hold_is_refused(ours: Cluster) -> None:
    done = _handshake(
        server_context(ours.node, "node"), client_context(ours.router, "router"), "node-b.local"
    )
    assert isinstance(done.client_error, ssl.SSLCertVerificationError)
    assert "Hostname mismatch" in _reason(done.client_error)


def test_tls12_is_refused(ours: Cluster) -> None:
    old = _by_hand(
        ours.router,
        ssl.PROTOCOL_TLS_CLIENT,
        ours.root / "ca.pem",
        maximum_version=ssl.TLSVersion.TLSv1_2,
    )
    done = _handshake(server_context(ours.node, "node"), old, "127.0.0.1")
    assert done.server_error is not None and done.client_error is not None
    assert _reason(done.server_error) == "UNSUPPORTED_PROTOCOL"


def _copy(member: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(member, tmp_path / member.name))


def test_each_side_refuses_to_start_as_the_other_role(ours: Cluster) -> None:
    with pytest.raises(TrustError, match="is a router certificate, not a node's"):
        server_context(ours.router, "node")
    with pytest.raises(TrustError, match="is a node certificate, not a router's"):
        client_context(ours.node, "router")
    with pytest.raises(TrustError, match="a node never dials"):
        client_context(ours.node, "node")
    with pytest.raises(TrustError, match="a router never answers"):
        server_context(ours.router, "router")


@pytest.mark.parametrize("missing", ["ca.pem", "cert.pem", "key.pem"])
def test_a_missing_file_refuses_to_start(ours: Cluster, tmp_path: Path, missing: str) -> None:
    member = _copy(ours.node, tmp_path)
    (member / missing).unlink()
    with pytest.raises(TrustError, match=rf"{missing} is missing"):
        server_context(member, "node")


def test_an_unreadable_file_refuses_to_start(ours: Cluster, tmp_path: Path) -> None:
    member = _copy(ours.node, tmp_path)
    (member / "key.pem").unlink()
    (member / "key.pem").mkdir()  # unreadable as a file, whoever runs the test (root too)
    with pytest.raises(TrustError, match=r"key\.pem cannot be read"):
        server_context(member, "node")


@pytest.mark.parametrize(
    ("swapped", "message"),
    [
        ("ca.pem", r"cert\.pem is not signed by .*ca\.pem"),  # a CA not the certificate's
        ("key.pem", "its key and certificate do not load"),  # a key not the certificate's
    ],
)
def test_files_of_two_clusters_mixed_refuse_to_start(
    ours: Cluster, theirs: Cluster, tmp_path: Path, swapped: str, message: str
) -> None:
    member = _copy(ours.node, tmp_path)
    shutil.copy(theirs.node / swapped, member / swapped)
    with pytest.raises(TrustError, match=message):
        server_context(member, "node")


def test_a_member_knows_its_name_and_end(ours: Cluster) -> None:
    member = load_member(ours.node, "node")
    assert (member.role, member.name) == ("node", "node-a")
    left = member.not_after - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=364) < left <= datetime.timedelta(days=365)


def test_a_reissue_does_not_revoke_the_certificate_before_it(ours: Cluster, tmp_path: Path) -> None:
    """There is no revocation list: a copy of the old files still gets in until its end (what
    docs/cluster.md says of rotation: a leaked key is cut off by a new CA)."""
    issue(ours.root, "router", "r2")
    old = _copy(ours.root / "routers" / "r2", tmp_path)
    issue(ours.root, "router", "r2")
    assert (old / "key.pem").read_bytes() != (ours.root / "routers/r2/key.pem").read_bytes()
    for member in (old, ours.root / "routers" / "r2"):
        done = _handshake(
            server_context(ours.node, "node"), client_context(member, "router"), "127.0.0.1"
        )
        assert done.accepted, done


def test_a_certificate_cannot_outlive_the_ca(ours: Cluster) -> None:
    late = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3400)
    with pytest.raises(TrustError, match="a certificate cannot outlive it"):
        issue(ours.root, "router", "late", now=late)
    assert not (ours.root / "routers" / "late").exists()
