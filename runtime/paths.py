"""Bundle folders (the search order itself: runtime/sources.py; the cache folder's one rule:
artifacts/settings.cache_dir)."""

from __future__ import annotations

from pathlib import Path

from cute_aot.artifacts.bundle import BUNDLE_SUFFIX

__all__ = ["expand_bundle_paths"]


def expand_bundle_paths(paths: list[Path]) -> list[Path]:
    """Folders become the bundle files directly inside them, sorted by name: regular files only
    (links to them too), since opening a FIFO someone left there would block its reader. One
    that is not a regular file is left out with the warning other unreadable bundles get, and so
    is a bundle name given that links to a folder."""
    from cute_aot.artifacts.core.notices import warn_once

    found = []
    for path in paths:
        if not path.is_dir():
            found.append(path)
            continue
        if path.name.endswith(BUNDLE_SUFFIX) and path.is_symlink():
            # Named as a bundle file, yet a link to a folder: said, never read as that folder
            warn_once(
                ("bundle-link-to-folder", str(path)),
                f"skipping {path}: a link to a folder ({path.resolve()}), not a bundle file",
            )
            continue
        for candidate in sorted(p for p in path.iterdir() if p.name.endswith(BUNDLE_SUFFIX)):
            if candidate.is_file():
                found.append(candidate)
            else:
                warn_once(
                    ("not-a-bundle-file", str(candidate)),
                    f"skipping {candidate}: not a regular file (a FIFO, a device, a "
                    "folder or a dangling link), so not a bundle",
                )
    return found
