"""Digests of the code that writes bundle bytes, shared by the build cache and the overlay cache.

A cache entry is only as good as the code that made it: the packer (link, pack, the container's
writer, the manifest's fields and JSON) is part of every bundle's bytes, so it is part of every
cache key. The bundle reader is not (artifacts/bundle.py): what it accepts is the format version's,
which is. Files are located and read, never imported (servers compute this on a miss and must not
import the build side).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from cute_aot.artifacts.digest import ABSENT, file_source, module_source, source_digest
from cute_aot.artifacts.manifest import FORMAT_VERSION

PACKER_MODULES = (
    "cute_aot.aot.pack",
    "cute_aot.aot.link",
    "cute_aot.artifacts.bundle_writer",
    "cute_aot.artifacts.manifest",
    "cute_aot.artifacts.toolchain",
)
# Data files of cute_aot.aot linked into every library.
PACKER_DATA = ("cute_dsl_shim.c", "shape_dispatch.c")


@functools.cache
def packer_code_digest() -> str:
    """The bundle format version, the packer's modules and the data files it links in."""
    modules = source_digest((name, module_source(name)) for name in PACKER_MODULES)
    spec = importlib.util.find_spec("cute_aot.aot")
    folder = Path(spec.origin).parent if spec and spec.origin else None
    return source_digest(
        ((name, file_source(folder / name) if folder else ABSENT) for name in PACKER_DATA),
        prefix=f"format {FORMAT_VERSION}\0".encode() + modules.encode(),
    )
