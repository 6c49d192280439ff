"""Image cells with secrets (SPEC §17, §12): the image's own CA-bundle paths hold the image's
CAs plus the sandbox's, read-only, so a client that reads the image's store (here curl's
built-in path, with every CA variable unset) reaches an HTTPS upstream with the placeholder
substituted. A real `sandcell serve`, an image built from a local OCI archive, a real cell."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cells.conftest import cells_unsupported
from network.tls.conftest import Upstream, UpstreamCA
from sandcell.client import ClientConfig
from sandcell.client.templates import Templates
from sandcell.isolation.images.stage import HOST_USR, host_python
from sandcell.isolation.images.trust import resolve
from support import oci
from support.server import OPEN_TEMPLATE, RunningServer, start_server

VALUE = "sk-image-cell-0123456789-never-in-the-cell"
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                "PIP_CERT", "GIT_SSL_CAINFO")  # fmt: skip
UPSTREAM_CA = UpstreamCA.make("upstream test CA")
IMAGE_CA = UpstreamCA.make("the image's own CA")  # in the image's Debian and Alpine paths
RHEL_CA = UpstreamCA.make("the image's RHEL CA")  # in its RHEL path, a bundle of its own

CONFIG = (
    '\n[server]\nupstream_ca_file = "{ca}"\n'
    + OPEN_TEMPLATE
    + """network_internal = true

[templates.tls]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 0
network_max = "open"
network_internal = true
image.base = "oci-archive:tls.tar"
"""
)


def image_layer() -> list[oci.Entry]:
    """The image's CA stores as distributions lay them out: Debian's file, Alpine's relative
    link to it, RHEL's absolute link to its extracted bundle, and a link into /tmp (the
    cell's own, never the image's) where openSUSE's would be."""
    rhel = "etc/pki/ca-trust/extracted/pem"
    dirs = ["etc/ssl", "etc/ssl/certs", "etc/pki", "etc/pki/tls", "etc/pki/tls/certs",
            "etc/pki/ca-trust", "etc/pki/ca-trust/extracted", rhel]  # fmt: skip
    return [
        *(oci.directory(d) for d in dirs),
        oci.file("etc/ssl/certs/ca-certificates.crt", IMAGE_CA.pem()),
        oci.symlink("etc/ssl/cert.pem", "certs/ca-certificates.crt"),
        oci.file(f"{rhel}/tls-ca-bundle.pem", RHEL_CA.pem()),
        oci.symlink("etc/pki/tls/certs/ca-bundle.crt", f"/{rhel}/tls-ca-bundle.pem"),
        oci.symlink("etc/ssl/ca-bundle.pem", "/tmp/planted.pem"),
    ]


def test_resolve_follows_links_inside_the_image(tmp_path: Path) -> None:
    root = tmp_path / "image"
    (root / "etc/ssl/certs").mkdir(parents=True)
    (root / "etc/ssl/certs/ca-certificates.crt").write_bytes(IMAGE_CA.pem())
    (root / "etc/ssl/cert.pem").symlink_to("certs/ca-certificates.crt")
    (root / "etc/ssl/up.pem").symlink_to("../../../../etc/ssl/cert.pem")  # `..` stops at /
    (root / "etc/ssl/abs.pem").symlink_to("/etc/ssl/cert.pem")
    (root / "etc/ssl/tmp.pem").symlink_to("/tmp/x.pem")
    (root / "etc/ssl/loop.pem").symlink_to("loop.pem")
    (root / "tmp").mkdir()
    (root / "tmp/x.pem").write_text("cell-owned")
    found = "/etc/ssl/certs/ca-certificates.crt"
    for name in ("certs/ca-certificates.crt", "cert.pem", "up.pem", "abs.pem"):
        assert resolve(str(root), f"/etc/ssl/{name}") == found, name
    for name in ("tmp.pem", "loop.pem", "missing.pem", "certs"):
        assert resolve(str(root), f"/etc/ssl/{name}") is None, name


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    upstream = Upstream(UPSTREAM_CA.server_context("localhost"))
    yield upstream
    upstream.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if why := cells_unsupported():
        pytest.skip(why)
    root = tmp_path_factory.mktemp("secrets-images")
    oci.write_archive(root / "tls.tar", [oci.busybox_rootfs(), image_layer()])
    (root / "upstream-ca.pem").write_bytes(UPSTREAM_CA.pem())
    srv = start_server(root / "data", config_text=CONFIG.format(ca=root / "upstream-ca.pem"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sandbox(server: RunningServer, upstream: Upstream) -> Iterator[tuple[httpx.Client, str]]:
    admin = ClientConfig(url=server.url, api_key=server.create_key("ops", admin=True))
    Templates.build("tls", config=admin)
    with server.client(server.create_key("alice")) as c:
        body = {"name": "API_TOKEN", "value": VALUE, "hosts": ["localhost"]}
        assert c.post("/v1/secrets", json=body).status_code == 201
        network = {"egress": "allowlist", "allow": [f"127.0.0.1:{upstream.port}"]}
        made = {"template": "tls", "secrets": ["API_TOKEN"], "network": network}
        r = c.post("/v1/sandboxes", json=made)
        assert r.status_code == 201, r.text
        yield c, r.json()["id"]
        c.delete(f"/v1/sandboxes/{r.json()['id']}")


def run(c: httpx.Client, sandbox_id: str, command: str) -> dict:
    body = {"command": command, "env": {"NO_PROXY": "", "no_proxy": ""}, "timeout_s": 30}
    r = c.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _certificates(pem: str) -> list[str]:
    marker = "-----BEGIN CERTIFICATE-----"
    return [marker + block for block in pem.split(marker)[1:]]


@pytest.mark.slow
def test_the_images_paths_hold_its_cas_and_the_sandboxs(sandbox) -> None:
    c, sbx = sandbox
    debian = run(c, sbx, "cat /etc/ssl/certs/ca-certificates.crt")["stdout"]
    image_ca, sandbox_ca = _certificates(debian)  # the image's CA, then the sandbox's
    assert image_ca.strip() == IMAGE_CA.pem().decode().strip()
    assert run(c, sbx, "cat /etc/ssl/cert.pem")["stdout"] == debian  # Alpine's link to it
    assert run(c, sbx, "cat $SSL_CERT_FILE")["stdout"] == debian  # the variables' too
    rhel = run(c, sbx, "cat /etc/pki/tls/certs/ca-bundle.crt")["stdout"]
    assert _certificates(rhel) == [RHEL_CA.pem().decode().strip() + "\n", sandbox_ca]
    # Not the host's CAs; read-only; the link into the cell's /tmp stays the image's link.
    assert UPSTREAM_CA.pem().decode() not in debian and "PRIVATE KEY" not in debian + rhel
    out = run(c, sbx, "echo x >> /etc/ssl/certs/ca-certificates.crt; echo $?; ls /etc/ssl/certs")
    assert out["stdout"].split() == ["1", "ca-certificates.crt"], out
    assert run(c, sbx, "readlink /etc/ssl/ca-bundle.pem")["stdout"].strip() == "/tmp/planted.pem"
    # Their mounts name no path of the host.
    mounts = run(c, sbx, "cat /proc/self/mountinfo")["stdout"].splitlines()
    points = {f[4]: f[3] for f in (line.split() for line in mounts)}
    for point in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/ca-trust/extracted/pem/"
                  "tls-ca-bundle.pem", "/run/sandcell/tls"):  # fmt: skip
        assert not points[point].startswith(("/tmp", "/var", "/root", "/work")), points[point]


@pytest.mark.slow
def test_curl_on_the_images_own_path_gets_the_value_substituted(sandbox, upstream) -> None:
    """curl's built-in CA path is /etc/ssl/certs/ca-certificates.crt: the host's curl, run
    through the runtime staged beside the image (the image has none), with every CA
    variable unset, trusts the sandbox's CA only through the image's path."""
    c, sbx = sandbox
    curl = shlex.join([*host_python()[:3], f"{HOST_USR}/bin/curl"])  # loader, libraries
    unset = " ".join(f"-u {name}" for name in CA_VARIABLES)
    url = f"https://localhost:{upstream.port}/image"
    command = f'env {unset} {curl} -sS --fail-with-body -H "Authorization: Bearer $API_TOKEN" {url}'
    out = run(c, sbx, command)
    assert out["exit_code"] == 0, out
    seen = upstream.seen.requests[-1]
    assert seen["path"] == "/image" and seen["headers"]["authorization"] == f"Bearer {VALUE}"
    assert VALUE not in out["stdout"] and "sandcell-secret-API_TOKEN-" in out["stdout"]
    # SPEC §20: the use is in the trail, by name and host, never by value
    uses = c.get("/v1/audit", params={"sandbox": sbx, "action": "secret.use"}).json()["records"]
    assert {"secret": "API_TOKEN", "host": "localhost", "decision": "substituted"} in [
        r["touched"] for r in uses
    ]
    assert VALUE not in str(uses) and {r["principal"] for r in uses} == {"alice"}
    # The image's own CA alone does not vouch for the proxy's certificate.
    run(c, sbx, f"printf %s {shlex.quote(IMAGE_CA.pem().decode())} > /tmp/image-ca.pem")
    out = run(c, sbx, f"env {unset} {curl} -sS --cacert /tmp/image-ca.pem {url}; echo $?")
    assert out["stdout"].split()[-1] == "60", out  # curl's "peer certificate" failure
