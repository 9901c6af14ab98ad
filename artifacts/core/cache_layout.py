"""The cache dir's layout, declared once: each area below settings.cache_dir(), as an object.

These names are on disk on every node: changing one orphans what is there (and `aot-cache gc`
collects only the areas declared in AREAS). The modules that write an area take its folder and
file names from here; `aot-cache gc` and `aot-cache env` iterate AREAS instead of knowing them.
This module imports nothing of the package: settings (and the startup hook) import it.
"""

from __future__ import annotations

import re
import sys
from collections import namedtuple

# artifacts/bundle.BUNDLE_SUFFIX, spelled here because that module is heavy to import
# (tests/test_cache_layout.py holds the two equal).
BUNDLE_SUFFIX = ".cuteaot"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ANY = re.compile(r".*", re.DOTALL)


# A namedtuple, not a dataclass: settings imports this module, and the startup hook imports
# settings in every process that sets an activating variable (dataclasses would bring inspect).
class CacheArea(
    namedtuple(
        "CacheArea",
        "name folder unit marker stem gc kind data parts label listed",
        defaults=("", None, (), "", ""),
    )
):
    """One area of the cache dir that `aot-cache gc` collects, unit by unit.

    A unit is the files that go together or not at all: its commit marker (published last,
    unlinked first, so a reader sees a whole unit or a miss) and, for some areas, a data file
    beside it named by the same stem. Temporaries of artifacts/core/atomic.py are collected at any
    depth of every area.

    name: `aot-cache gc --cache NAME`, the rows of gc's and env's reports; folder: below the
    cache dir; unit: one unit's files below `folder`, commit marker first (for people); marker:
    the commit marker's suffix; stem: what comes before a unit file's suffix (a pattern); gc:
    how gc finds units, one of GC_RULES; kind: what gc calls one unit; data: the data file's
    suffix (None: the marker is the unit's one file); parts: for "shards", (subfolder, its
    units' data suffix); label: `aot-cache env` lists the area as this ("": not listed);
    listed: what `aot-cache env` counts in it (a glob, at any depth)."""

    __slots__ = ()

    def is_unit_file(self, name: str, suffix: str) -> bool:
        """Whether `name` is a unit's file ending in `suffix` (the marker's or data's)."""
        stem = name.removesuffix(suffix)
        return stem != name and self.stem.fullmatch(stem) is not None


GC_RULES = {
    "entries": "one file per unit at any depth; a refused entry always goes",
    "memos": "one file per unit, directly in the folder",
    "pairs": "marker + data per stem, directly in the folder",
    "shards": "marker + data per stem, in <part>/<stem[:2]>/ for each part",
    "downloads": "copies directly in the folder, indexes in index/; unread ones go after an hour",
}

OVERLAY = CacheArea(
    "overlay",
    "overlay",
    unit=f"<fingerprint>/<arch>/<key id>{BUNDLE_SUFFIX}",  # runtime/overlay.py: JIT results
    marker=BUNDLE_SUFFIX,
    stem=_ANY,
    gc="entries",
    kind="entry",
    label="overlay",
    listed=f"*{BUNDLE_SUFFIX}",
)
OVERLAY_REFUSED = ".refused-"  # <entry>.refused-<random>: set aside by a reader, for gc
LIBS = CacheArea(
    "libs",
    "libs",
    unit="<sha256>.verified.json + <sha256>.so",  # runtime/library_store.py: the facts, then it
    marker=".verified.json",
    stem=_HEX64,
    gc="pairs",
    kind="library",
    data=".so",
    label="unpacked libraries",
    listed="*.so",
)
# runtime/manifest_memo.py: marshal's format is the interpreter's, each keeps its own memos.
MEMO_SUFFIX = f".{sys.implementation.cache_tag}.marshal"
MANIFESTS = CacheArea(
    "manifests",
    "manifests",
    unit="<sha256>.<python>.marshal",  # a decoded manifest
    marker=".marshal",
    stem=re.compile(r"[0-9a-f]{64}\.[A-Za-z0-9_-]+"),
    gc="memos",
    kind="manifest",
    label="decoded manifests",
    listed=f"*{MEMO_SUFFIX}",
)
BUILD = CacheArea(
    "build",
    "build",  # aot/build_cache.py: the build cache's default root (aot-build --cache-dir)
    unit=f"{{objects,bundles}}/<d[:2]>/<d>.json + <d>.{{o,{BUNDLE_SUFFIX[1:]}}}",
    marker=".json",  # the record beside each entry's data
    stem=_HEX64,
    gc="shards",
    parts=(("objects", ".o"), ("bundles", BUNDLE_SUFFIX)),
)
REMOTE = CacheArea(
    "remote",
    "remote",
    unit=f"<sha256>{BUNDLE_SUFFIX}",  # runtime/remote.py: verified copies of bundles at URLs
    marker=BUNDLE_SUFFIX,
    stem=_HEX64,
    gc="downloads",
    kind="copy",
)
REMOTE_INDEX = "index"  # remote/index/<url id>.json: what each URL held at its last fetch
REMOTE_INDEX_SUFFIX = ".json"
REMOTE_INDEX_STEM = re.compile(r"[0-9a-f]{32}")  # a URL's id
REMOTE_LOCKS = "locks"  # remote/locks/<url id>.lock: one fetch of a URL at a time; never collected

# The areas gc collects, in the order `aot-cache env` lists them.
AREAS = (OVERLAY, LIBS, MANIFESTS, BUILD, REMOTE)

# Not collected (gc takes only temporaries from them):
KEYS = "keys"  # the overlay's signing key, keys/overlay.pem
MISS_LOG = "misses.jsonl"  # the default miss log
