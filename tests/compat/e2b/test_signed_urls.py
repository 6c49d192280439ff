"""E2B's signed file URLs (SPEC §14.2): `upload_url` / `download_url` of the unmodified SDK
land at the server's root (`urljoin` drops /e2b) and work there with plain HTTP, bound to the
sandbox, path, operation, user and expiry; each alteration is refused in envd's words."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from e2b import Sandbox

from sandcell.compat.e2b.signed import signature
from support.server import RunningServer

pytestmark = pytest.mark.slow

# Refused calls are throttled per client address: each comes from an address of its own.
_ADDRESSES = (f"127.0.{i // 250}.{i % 250 + 2}" for i in itertools.count(start=1000))


@pytest.fixture(scope="module")
def other() -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300)
    yield sandbox
    sandbox.kill()


def _altered(url: str, **changes: str | None) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return urlunsplit(parts._replace(query=urlencode(query)))


def _refused(method: str, url: str, message: str, status: int = 401, **kw: object) -> None:
    transport = httpx.HTTPTransport(local_address=next(_ADDRESSES))
    with httpx.Client(transport=transport, timeout=30) as client:
        answer = client.request(method, url, **kw)  # type: ignore[arg-type]
    assert answer.status_code == status, (url, answer.status_code, answer.text)
    assert answer.json() == {"code": status, "message": message}


def test_the_sdks_urls_land_at_the_root(e2b_server: RunningServer, sbx: Sandbox) -> None:
    url = sbx.download_url("/home/user/x.txt")
    assert url.startswith(f"{e2b_server.url}/files?path=")  # /e2b is dropped by urljoin
    assert "signature=v1_" in url and sbx.sandbox_id not in url


def test_upload_then_download_with_plain_http(sbx: Sandbox, other: Sandbox) -> None:
    up = sbx.upload_url("/home/user/signed/up.txt", use_signature_expiration=120)
    form = httpx.post(up, files={"file": ("up.txt", b"through a signed URL\n")}, timeout=30)
    assert form.status_code == 200, form.text
    assert form.json() == [{"name": "up.txt", "type": "file", "path": "/home/user/signed/up.txt"}]
    assert sbx.files.read("/home/user/signed/up.txt") == "through a signed URL\n"
    # A raw body too, and a relative path, without expiry (as the SDK signs by default).
    raw = httpx.post(sbx.upload_url("signed/raw.bin"), content=b"\x00\x01raw", timeout=30)
    assert raw.status_code == 200, raw.text
    assert sbx.files.read("signed/raw.bin", format="bytes") == b"\x00\x01raw"
    down = httpx.get(sbx.download_url("/home/user/signed/up.txt", use_signature_expiration=60))
    assert down.status_code == 200 and down.content == b"through a signed URL\n"
    # Two sandboxes, one path: each URL opens its own sandbox's file.
    other.files.write("/home/user/signed/up.txt", "the other sandbox's\n")
    assert httpx.get(other.download_url("/home/user/signed/up.txt")).text == (
        "the other sandbox's\n"
    )
    assert httpx.get(sbx.download_url("/home/user/signed/up.txt")).text == (
        "through a signed URL\n"
    )
    # `user=` is signed too: the URL that names it works.
    assert httpx.get(sbx.download_url("signed/raw.bin", user="user")).content == b"\x00\x01raw"


def test_altered_or_expired_urls_are_refused(sbx: Sandbox, other: Sandbox) -> None:
    sbx.files.write("/home/user/signed/secret.txt", "secret")
    down = sbx.download_url("/home/user/signed/secret.txt", use_signature_expiration=120)
    up = sbx.upload_url("/home/user/signed/planted.txt", use_signature_expiration=120)
    invalid = "invalid signature"
    _refused("GET", _altered(down, path="/home/user/signed/other.txt"), invalid)
    _refused("GET", _altered(down, username="root"), invalid)
    later = str(int(urlsplit(down).query.split("signature_expiration=")[1]) + 3600)
    _refused("GET", _altered(down, signature_expiration=later), invalid)  # a longer life
    _refused("GET", _altered(down, signature_expiration=None), invalid)  # no expiry at all
    _refused("POST", down, invalid, content=b"planted")  # a read signature used to write
    _refused("GET", up, invalid)  # and a write signature used to read
    _refused("GET", _altered(down, signature="v1_" + "A" * 43), invalid)  # garbage
    _refused("GET", _altered(down, signature="nonsense"), invalid)
    _refused("GET", _altered(down, signature=None), "missing signature query parameter")
    _refused(
        "GET",
        _altered(down, signature=None, signature_expiration=None),
        "missing signature query parameter",
    )
    message = "signature_expiration must be an integer (Unix seconds)"
    _refused("GET", _altered(down, signature_expiration="soon"), message, status=400)
    expired = sbx.download_url("/home/user/signed/secret.txt", use_signature_expiration=-10)
    _refused("GET", expired, "signature is already expired")
    expired_up = sbx.upload_url("/home/user/signed/planted.txt", use_signature_expiration=-10)
    _refused("POST", expired_up, "signature is already expired", content=b"planted")
    assert not sbx.files.exists("/home/user/signed/planted.txt")
    # Another sandbox's token signs nothing of this one: at the root it opens that other
    # sandbox, where the file is not, and on the façade's envd route, which names this
    # sandbox, it is refused.
    path = "/home/user/signed/secret.txt"
    forged = signature(path, "read", "", other._envd_access_token or "", None)
    at_root = _altered(down, signature=forged, signature_expiration=None)
    _refused("GET", at_root, "signed/secret.txt: No such file or directory", status=404)
    named = at_root.replace("/files?", "/e2b/files?")
    transport = httpx.HTTPTransport(local_address=next(_ADDRESSES))
    with httpx.Client(transport=transport, timeout=30) as client:
        answer = client.get(named, headers={"E2b-Sandbox-Id": sbx.sandbox_id})
    assert answer.status_code == 401 and answer.json()["message"] == invalid
    # PUT is not a signed operation (envd signs GET and POST only).
    _refused("PUT", up, "PUT /files is not served", status=405, content=b"x")


def test_a_killed_sandboxs_urls_stop_working() -> None:
    sandbox = Sandbox.create(timeout=120)
    sandbox.files.write("gone.txt", "soon gone")
    url = sandbox.download_url("gone.txt")
    assert httpx.get(url).text == "soon gone"
    sandbox.kill()
    _refused("GET", url, "invalid signature")


def test_connect_hands_out_the_same_token(sbx: Sandbox) -> None:
    """One token per sandbox, as on E2B: a URL signed before `connect` still works after."""
    url = sbx.download_url("/home/user/signed/up.txt")
    again = Sandbox.connect(sbx.sandbox_id)
    assert again._envd_access_token == sbx._envd_access_token
    assert httpx.get(url).status_code == 200
