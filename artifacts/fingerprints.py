"""The packer's identity, shared by the build cache and the overlay cache.

A cache entry is only as good as the code that made it: the packer (link, pack, the container's
writer, the manifest's fields and JSON, the C sources linked into every library) is part of every
bundle's bytes, so its identity is part of every cache key. That identity is an explicit version,
bumped when the bytes the packer writes for the same objects change; nothing else of cute-aot
(settings, layout, the CLIs) moves it. tests/test_previous_commit_artifacts.py links the previous
commit's objects and compares the bytes, so bytes that change without a bump fail there.
"""

from __future__ import annotations

from cute_aot.artifacts.digest import json_digest
from cute_aot.artifacts.manifest import FORMAT_VERSION

PACKER_VERSION = 1

# (format version, packer version) -> the identity earlier releases computed from the packer's
# source files before it was a version: the caches they filled stay valid.
_EARLIER_IDENTITIES = {
    (1, 1): "6305a3084e8ffad9e38cba5d8ba5a838f15649b8ddfe97c04d53c616fa7bf124",
}


def packer_identity(format_version: int = FORMAT_VERSION, packer: int = PACKER_VERSION) -> str:
    """The bundle format version and the packer version, as one cache-key component."""
    earlier = _EARLIER_IDENTITIES.get((format_version, packer))
    if earlier is not None:
        return earlier
    return json_digest({"format": format_version, "packer": packer})
