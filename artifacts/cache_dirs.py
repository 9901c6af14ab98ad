"""The per-user cute-aot cache folder: one rule for every part that keeps files there.

The build cache (aot/), the unpacked bundle libraries, the overlay of JIT results and the miss log
(runtime/) all live under it, so the rule lives here, below both.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "CUTE_AOT_CACHE_DIR"


def cache_dir() -> Path:
    """$CUTE_AOT_CACHE_DIR, else $XDG_CACHE_HOME/cute-aot, else ~/.cache/cute-aot."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cute-aot"
