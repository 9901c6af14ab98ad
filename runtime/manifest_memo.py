"""Manifests decoded before, kept per user: <cache dir>/manifests/<sha256>.<python>.marshal.

A recorded kernel's key is kilobytes of JSON inside JSON, so a 600-kernel recorded bundle has a
3.7 MB manifest, and reading, hashing and decoding it was most of the bundle's open (~27 ms of
~42 here); `marshal` reads the same values in ~4 ms. A server's restart opens the bundle through
its verified private library (runtime/loader.py) and takes the manifest's values from here, by
the manifest sha256 the bundle's header names. Values are kept only once bytes with that hash
were read, decoded and passed every check, so they are what an intact file holds; the file's
manifest bytes are not read again (artifacts/bundle.read_manifest), and the values are checked as
a manifest again. Nothing from here is read unless it is a private file of this user in private
folders up to the cache dir (runtime/private_files.py), the rule that lets the loader trust its
verified libraries. A memo that cannot be read, kept or trusted is a miss: the manifest is read
and decoded as before. `aot-cache gc` collects memos by age like the other caches.
"""

from __future__ import annotations

import marshal
import re
from typing import Any

from cute_aot.artifacts.bundle import MAX_MANIFEST_BYTES
from cute_aot.artifacts.core import cache_layout, settings
from cute_aot.artifacts.core.atomic import atomic_write
from cute_aot.runtime.private_files import make_private_folder, read_private

# The memo's area of the cache dir, declared with the others (artifacts/core/cache_layout.py).
FOLDER = cache_layout.MANIFESTS.folder
# marshal's format is the interpreter's: each keeps its own memos.
SUFFIX = cache_layout.MEMO_SUFFIX
# What gc collects: any interpreter's memos.
MEMO_NAME = re.compile(
    cache_layout.MANIFESTS.stem.pattern + re.escape(cache_layout.MANIFESTS.marker)
)
MAX_BYTES = 2 * MAX_MANIFEST_BYTES  # more than any manifest the reader takes decodes to


class ManifestMemo:
    """The memo of the current cache dir (artifacts/bundle.DecodedManifests)."""

    def get(self, sha256: str) -> Any | None:
        root = settings.cache_dir()
        try:
            data = read_private(root / FOLDER / f"{sha256}{SUFFIX}", root, MAX_BYTES)
            return marshal.loads(data) if data is not None else None
        except (OSError, EOFError, ValueError, TypeError):  # damaged: decoded as before
            return None

    def put(self, sha256: str, decoded: Any) -> None:
        root = settings.cache_dir()
        folder = root / FOLDER
        try:
            make_private_folder(folder, root)
            atomic_write(folder / f"{sha256}{SUFFIX}", marshal.dumps(decoded), mode=0o444)
        except (OSError, ValueError):  # a read-only or full cache dir: the next open decodes
            pass


MEMO = ManifestMemo()
