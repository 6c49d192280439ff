"""OCI image archives made by the tests themselves (no registry): a layout tar with an index,
a manifest, a config and gzip layers, each layer a list of tar members."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import struct
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

OS_RELEASE = b'NAME="sandcell test image"\nID=sandcelltest\n'


@dataclass(frozen=True)
class Entry:
    """One layer member: a file (data), a dir, a symlink or hard link (link), a whiteout."""

    name: str
    data: bytes | None = None
    kind: bytes = tarfile.REGTYPE
    link: str = ""
    mode: int = 0o644


def file(name: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(name, data, mode=mode)


def directory(name: str) -> Entry:
    return Entry(name, kind=tarfile.DIRTYPE, mode=0o755)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, kind=tarfile.SYMTYPE, link=target, mode=0o777)


def hardlink(name: str, target: str) -> Entry:
    return Entry(name, kind=tarfile.LNKTYPE, link=target)


def layer_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type, info.mode, info.linkname = e.kind, e.mode, e.link
            info.size = len(e.data or b"")
            tar.addfile(info, io.BytesIO(e.data or b""))
    return buf.getvalue()


def zeros_layer(files: list[tuple[str, int]]) -> bytes:
    """A gzip layer of files of zeros (name, size), made without holding or compressing
    them whole: a tar of zeros is its headers and runs of zero bytes, and a run deflated
    after a full flush is the same bytes each time, so 1 GiB costs one MiB-sized block
    compressed once. A real, valid gzip stream (its CRC and length included): a bomb of
    about 1,000:1, as `gzip -9` would make it."""
    chunk = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    out, crc, total = [], 0, 0

    def add(data: bytes) -> None:
        nonlocal crc, total
        out.append(deflate.compress(data) + deflate.flush(zlib.Z_FULL_FLUSH))
        crc, total = zlib.crc32(data, crc), total + len(data)

    def zeros(n: int) -> None:
        nonlocal crc, total
        whole, rest = divmod(n, len(chunk))
        out.append(block * whole)
        for _ in range(whole):
            crc = zlib.crc32(chunk, crc)
        total += whole * len(chunk)
        add(bytes(rest))

    for name, size in files:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644
        add(info.tobuf(format=tarfile.PAX_FORMAT))
        zeros(size + -size % tarfile.BLOCKSIZE)
    end = 2 * tarfile.BLOCKSIZE
    zeros(end + -(total + end) % tarfile.RECORDSIZE)
    out.append(deflate.flush())
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + b"".join(out) + struct.pack("<II", crc, total & 0xFFFFFFFF)


def sparse_layer(name: str, size: int, workdir: Path) -> bytes:
    """A plain tar layer made by GNU tar holding `name` as a sparse file of `size` bytes
    that are all hole: a few KiB of archive."""
    source = workdir / "sparse-source"
    source.mkdir()
    with open(source / name, "wb") as f:
        f.truncate(size)
    layer = workdir / "sparse-layer.tar"
    tar = ["tar", "--sparse", "--format=pax", "-C", str(source), "-cf", str(layer), name]
    subprocess.run(tar, check=True, capture_output=True)
    data = layer.read_bytes()
    shutil.rmtree(source)
    layer.unlink()
    return data


def busybox_rootfs() -> list[Entry]:
    """A tiny root: a static busybox with its applets linked where busybox images put them,
    and an os-release of its own. No Python, no libc."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    listing = subprocess.run([busybox, "--list-full"], capture_output=True, check=True)
    applets = [a for a in listing.stdout.decode().split() if a != "bin/busybox"]
    dirs = sorted({"bin", "etc", "tmp", *(str(Path(a).parent) for a in applets)})
    entries = [directory(d) for d in dirs]
    entries.append(file("bin/busybox", Path(busybox).read_bytes(), 0o755))
    entries += [symlink(a, "/bin/busybox") for a in applets]
    return [*entries, file("etc/os-release", OS_RELEASE)]


def write_archive(
    path: Path,
    layers: list[list[Entry] | bytes],
    env: list[str] | None = None,
    workdir: str = "",
) -> Path:
    """Each layer is a list of entries (a gzip tar made here) or a layer blob made
    elsewhere: gzip, or a plain tar."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    layer_descs = []
    for layer in layers:
        data = layer if isinstance(layer, bytes) else gzip.compress(layer_tar(layer), mtime=0)
        kind = "tar+gzip" if data[:2] == b"\x1f\x8b" else "tar"
        layer_descs.append(blob(data, f"application/vnd.oci.image.layer.v1.{kind}"))
    config = {"config": {"Env": env or [], "WorkingDir": workdir}, "rootfs": {}}
    manifest = {
        "schemaVersion": 2,
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": layer_descs,
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        ],
    }
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index)}
    files |= {f"blobs/sha256/{d}": data for d, data in blobs.items()}
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path
