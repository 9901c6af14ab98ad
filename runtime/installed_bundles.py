"""Bundles shipped as pip wheels: each registers the folder of its bundle files under the
entry-point group `cute_aot.bundles` (see `aot-build wheel`)."""

from __future__ import annotations

ENTRY_POINT_GROUP = "cute_aot.bundles"


def installed_bundle_sources() -> list[str]:
    """Folders of the bundles installed as wheels, in a stable order."""
    return []
