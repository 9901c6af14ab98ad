"""Digests of the code that writes bundle bytes, shared by the build cache and the overlay cache.

A cache entry is only as good as the code that made it: the packer (link, pack, container,
manifest) is part of every bundle's bytes, so it is part of every cache key. Files are located and
read, never imported (servers compute this on a miss and must not import the build side).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from cute_aot.artifacts.manifest import FORMAT_VERSION

PACKER_MODULES = (
    "cute_aot.aot.pack",
    "cute_aot.aot.link",
    "cute_aot.artifacts.bundle",
    "cute_aot.artifacts.manifest",
    "cute_aot.artifacts.toolchain",
)
# Data files of cute_aot.aot linked into every library.
PACKER_DATA = ("cute_dsl_shim.c", "shape_dispatch.c")


def module_sources_digest(names: tuple[str, ...]) -> str:
    """sha256 over the source files of these modules (absent ones count as absent)."""
    digest = hashlib.sha256()
    for name in names:
        spec = importlib.util.find_spec(name)
        source = Path(spec.origin).read_bytes() if spec and spec.origin else b"<absent>"
        digest.update(name.encode() + b"\0" + source + b"\0")
    return digest.hexdigest()


@functools.cache
def packer_code_digest() -> str:
    """The bundle format version, the packer's modules and the data files it links in."""
    digest = hashlib.sha256(f"format {FORMAT_VERSION}\0".encode())
    digest.update(module_sources_digest(PACKER_MODULES).encode())
    spec = importlib.util.find_spec("cute_aot.aot")
    folder = Path(spec.origin).parent if spec and spec.origin else None
    for name in PACKER_DATA:
        path = folder / name if folder else None
        data = path.read_bytes() if path and path.is_file() else b"<absent>"
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
