"""Where the runtime finds bundles: one search order for servers and for `aot-cache`.

    1. explicit sources (load_bundles(...) arguments; for the environment: CUTE_AOT_BUNDLES),
       in the order given: files, folders, or URLs of any fsspec protocol
    2. the bundles of installed bundle wheels (entry-point group `cute_aot.bundles`)

A URL is fetched into a content-addressed, verified download cache and served from there
(runtime/remote.py); an installed wheel names the folder its bundles live in
(runtime/installed_bundles.py). Everything downstream sees local paths only.
"""

from __future__ import annotations

from pathlib import Path

from cute_aot.artifacts.core import settings
from cute_aot.artifacts.core.urls import is_url, local_path
from cute_aot.runtime.remote import fetch

__all__ = ["environment_sources", "is_url", "local_paths"]


def environment_sources() -> list[str]:
    """What a server loads without being told: CUTE_AOT_BUNDLES, then installed bundle wheels."""
    from cute_aot.runtime.installed_bundles import installed_bundle_sources

    return [*settings.bundle_sources(), *installed_bundle_sources()]


def local_paths(source: str) -> list[Path]:
    """A source as local files or folders. A URL is fetched (or its verified cached copy used);
    OSError when it can be neither."""
    path = local_path(source)
    if path is not None:
        return [path]
    return fetch(source)
