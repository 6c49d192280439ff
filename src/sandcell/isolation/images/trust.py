"""The sandbox's CA in an image's own CA-bundle paths (SPEC §17): a client that reads the
image's store (curl's built-in path, OpenSSL's default, Go's list) trusts the sandbox's CA
too, not only one that follows `SSL_CERT_FILE`.

Where the image has a bundle, the cell sees there that bundle plus the sandbox's CA, read-only;
the bundle the variables name (`/run/sandcell/tls/`) becomes the image's first one plus the CA
as well, so every path of an image cell trusts the image's CAs, never the host's. An image
without one (busybox, scratch) keeps the bundle the CA's authority staged (the host's CAs
plus the sandbox's), at the variables' path only.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from sandcell.isolation.bwrap import Bind
from sandcell.isolation.images.stage import HIDDEN_ENTRIES, OWN_ENTRIES

# Where the usual distributions keep their bundle (the list Go's crypto/x509 reads).
BUNDLE_PATHS = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, distroless, Gentoo
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/pki/tls/cacert.pem",  # OpenELEC
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # CentOS, RHEL 7+
    "/etc/ssl/cert.pem",  # Alpine, Arch
)
MAX_BUNDLE_BYTES = 8 << 20  # an image's bundle is well under 1 MiB; past this it is skipped
_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
_BEGIN = b"-----BEGIN CERTIFICATE-----"


def image_trust(image_root: str, ca_dir: Path, scratch: Path, cell_ca_dir: str) -> list[Bind]:
    """The binds that make an image cell trust the sandbox's CA: each of the image's bundles
    with the CA added (files under `scratch/tls`, 0444), bound over the real file it names,
    and that directory at `cell_ca_dir`. `ca_dir` is the authority's, holding only its
    bundle, the sandbox's CA last. Empty where the image has no bundle."""
    (staged,) = ca_dir.glob("*.pem")  # the one bundle (never a `.partial` left by a crash)
    sandbox_ca = _BEGIN + staged.read_bytes().rsplit(_BEGIN, 1)[1]
    found: dict[str, bytes] = {}  # the image's real path -> its bundle
    for path in BUNDLE_PATHS:
        real = resolve(image_root, path)
        if real is not None and real not in found and (own := _read(image_root, real)) is not None:
            found[real] = own
    if not found:
        return []
    directory = scratch / "tls"
    directory.mkdir(mode=0o755)
    binds = []
    for index, (real, own) in enumerate(found.items()):
        bundle = directory / (staged.name if index == 0 else f"image-{index}.pem")
        bundle.write_bytes(own.rstrip(b"\n") + b"\n" + sandbox_ca if own.strip() else sandbox_ca)
        bundle.chmod(0o444)
        binds.append(Bind(str(bundle), real))
    # The first, under the staged bundle's name, is also the one the variables name.
    return [Bind(str(directory), cell_ca_dir), *binds]


def resolve(image_root: str, path: str) -> str | None:
    """`path` as a process in the image cell would find it: links followed inside the image
    (an absolute one from the image's /, `..` never above it). The regular file it names,
    as a path inside the image, or None: missing, a loop, or on a place the cell owns
    (/tmp, /run, ...), which is not the image's."""
    pending = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while pending:
        name = pending.pop(0)
        if name in (".", ""):
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(image_root, *done, name)
        if os.path.islink(here):
            links += 1
            if links > _MAX_LINKS:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            pending = [p for p in target.split("/") if p] + pending
            continue
        done.append(name)
    if not done or done[0] in OWN_ENTRIES | HIDDEN_ENTRIES | {"home"}:
        return None
    return "/" + posixpath.join(*done) if os.path.isfile(os.path.join(image_root, *done)) else None


def _read(image_root: str, real: str) -> bytes | None:
    """The bundle at `real` (resolved: no link on the way; empty, as an image without
    ca-certificates has it, is a bundle of none), or None when it is too large to be one."""
    fd = os.open(os.path.join(image_root, real.lstrip("/")), os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BUNDLE_BYTES + 1)
    return data if len(data) <= MAX_BUNDLE_BYTES else None
