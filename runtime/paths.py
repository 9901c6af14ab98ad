"""Where the runtime looks for bundles and keeps its per-machine cache (env overrides first)."""

from __future__ import annotations

import os
from pathlib import Path

from cute_aot.artifacts.bundle import BUNDLE_SUFFIX

BUNDLES_ENV = "CUTE_AOT_BUNDLES"
CACHE_DIR_ENV = "CUTE_AOT_CACHE_DIR"


def cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cute-aot"


def bundle_search_paths() -> list[Path]:
    """CUTE_AOT_BUNDLES: files or folders, separated like PATH."""
    value = os.environ.get(BUNDLES_ENV, "")
    return [Path(part) for part in value.split(os.pathsep) if part]


def expand_bundle_paths(paths: list[Path]) -> list[Path]:
    """Folders become the bundle files directly inside them, sorted by name."""
    found = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.iterdir() if p.name.endswith(BUNDLE_SUFFIX))
        else:
            found.append(path)
    return found
