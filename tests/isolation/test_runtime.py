"""What cells import read-only comes with its byte code, so no daemon start compiles."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import sandcell
from sandcell.isolation.runtime import compile_package


def test_every_module_of_the_package_has_current_byte_code() -> None:
    compile_package()
    stale = []
    for source in Path(sandcell.__file__).parent.rglob("*.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        # A .pyc header: magic, flags, then the source's mtime and size it was compiled from.
        header = cached.read_bytes()[:16] if cached.exists() else b""
        stat = source.stat()
        if len(header) < 16 or struct.unpack("<II", header[8:16]) != (
            int(stat.st_mtime) & 0xFFFFFFFF,
            stat.st_size & 0xFFFFFFFF,
        ):
            stale.append(str(source))
    assert stale == []
