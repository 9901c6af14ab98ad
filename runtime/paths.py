"""Bundle folders and the per-machine cache dir (the search order itself: runtime/sources.py)."""

from __future__ import annotations

from pathlib import Path

from cute_aot.artifacts import settings
from cute_aot.artifacts.bundle import BUNDLE_SUFFIX

# The cache folder's rule is shared with the build cache (aot/), so it lives in artifacts.
from cute_aot.artifacts.cache_dirs import CACHE_DIR_ENV, cache_dir

__all__ = [
    "BUNDLES_ENV",
    "CACHE_DIR_ENV",
    "cache_dir",
    "expand_bundle_paths",
]

BUNDLES_ENV = settings.BUNDLES.name


def expand_bundle_paths(paths: list[Path]) -> list[Path]:
    """Folders become the bundle files directly inside them, sorted by name: regular files only
    (links to them too), since opening a FIFO someone left there would block its reader."""
    found = []
    for path in paths:
        if path.is_dir():
            found += sorted(
                p for p in path.iterdir() if p.name.endswith(BUNDLE_SUFFIX) and p.is_file()
            )
        else:
            found.append(path)
    return found
