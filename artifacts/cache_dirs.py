"""The per-user cute-aot cache folder: one rule for every part that keeps files there.

The build cache (aot/), the unpacked bundle libraries, the overlay of JIT results and the miss log
(runtime/) all live under it, so the rule lives here, below both (read in artifacts/settings.py).
"""

from __future__ import annotations

from cute_aot.artifacts.settings import CACHE_DIR, cache_dir

CACHE_DIR_ENV = CACHE_DIR.name

__all__ = ["CACHE_DIR_ENV", "cache_dir"]
