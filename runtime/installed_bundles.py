"""Bundles shipped as pip wheels: each registers the folder of its bundle files under the
entry-point group `cute_aot.bundles` (see `aot-build wheel`).

Found from distribution metadata alone: a bundle package is never imported (its folder is data),
so discovery runs no installed code. The folder is located with `importlib.util.find_spec` of the
top-level package, which looks it up on sys.path without executing it; a dotted value is then
followed as sub-folders of that package, again without importing anything.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from cute_aot.artifacts.bundle import BUNDLE_ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from cute_aot.artifacts.core.notices import warn_once


@dataclass(frozen=True)
class InstalledBundles:
    """The bundle folder one installed distribution registers."""

    name: str  # the entry point's name: `<bundle name>-<arch>`
    folder: Path
    distribution: str
    version: str

    @property
    def origin(self) -> str:
        """How `aot-cache ls` names where the bundles came from (a requirement pip reads)."""
        return f"wheel {self.distribution}=={self.version}"


def installed_bundles() -> list[InstalledBundles]:
    """Every registered bundle folder, sorted by entry point name (then distribution); a broken
    entry point is skipped with one warning naming its distribution."""
    return list(_discover(_search_path_state()))


def installed_bundle_sources() -> list[str]:
    """Folders of the bundles installed as wheels, in a stable order."""
    return [str(found.folder) for found in installed_bundles()]


def _search_path_state() -> tuple:
    """sys.path with each folder's mtime: installing or removing a distribution changes its
    site folder's mtime (as importlib's own finders assume), so a cached discovery is redone
    exactly when it could differ. The registry asks on every miss: ~50 µs, not an ~8 ms scan."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


@functools.lru_cache(maxsize=1)
def _discover(search_path_state: tuple) -> tuple[InstalledBundles, ...]:
    found = []
    points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    for point in sorted(points, key=lambda p: (p.name, _distribution(p)[0])):
        distribution, version = _distribution(point)
        try:
            folder = _package_folder(point)
        except Exception as exc:  # one broken wheel must not keep a server from the others
            warn_once(
                ("bundle-wheel", distribution, point.name),
                f"skipping bundles {point.name!r} of distribution {distribution} {version} "
                f"({ENTRY_POINT_GROUP} = {point.value!r}): {exc}",
            )
            continue
        found.append(InstalledBundles(point.name, folder, distribution, version))
    return tuple(found)


def _distribution(point: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(point, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.name, dist.version


def _package_folder(point: metadata.EntryPoint) -> Path:
    """The folder of the package an entry point names, found without importing it."""
    if point.attr is not None:
        raise ValueError("the value must name a package (its folder holds the bundles)")
    top, *inner = point.module.split(".")
    # find_spec of a top-level name executes nothing; of `a.b` it would import `a`.
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise FileNotFoundError(f"package {top!r} is not installed (its folder is missing)")
    if not spec.submodule_search_locations:
        raise NotADirectoryError(f"{top!r} is a module, not a package folder")
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*inner)
    if not folder.is_dir():
        raise FileNotFoundError(f"folder {folder} is missing")
    return folder
