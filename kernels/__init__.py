"""Kernel families, found through the entry-point group ``cute_aot.families``.

Each entry point names a `KernelFamily` instance (kernels/contract.py). Ours register exactly as
another project's would, in pyproject.toml. A family whose package fails to
import is left out with one warning naming it; the others keep working.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import threading
import warnings
from importlib import metadata, resources

from cute_aot.artifacts.errors import UnsupportedProblemError
from cute_aot.kernels.contract import Dispatch, KernelFamily, TensorArg

__all__ = [
    "ENTRY_POINT_GROUP",
    "Dispatch",
    "KernelFamily",
    "TensorArg",
    "families",
    "family",
    "family_facts",
    "forget_families",
    "source_hash",
]

ENTRY_POINT_GROUP = "cute_aot.families"

_lock = threading.Lock()
_families: dict[str, KernelFamily] | None = None


def _discover() -> dict[str, KernelFamily]:
    found: dict[str, KernelFamily] = {}
    for point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        package = point.dist.name if point.dist else point.value
        try:
            candidate = point.load()
            if isinstance(candidate, type):
                candidate = candidate()
            if not isinstance(candidate, KernelFamily):
                raise TypeError(
                    f"{point.value} is a {type(candidate).__name__}, not a KernelFamily"
                )
            if candidate.name != point.name:
                raise ValueError(f"{point.value} is named {candidate.name!r}, not {point.name!r}")
        except Exception as exc:  # one broken plug-in must not take the others down
            warnings.warn(
                f"cute-aot: kernel family {point.name!r} from package {package!r} "
                f"({point.value}) is left out: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        if point.name in found:
            warnings.warn(
                f"cute-aot: kernel family {point.name!r} is registered twice; "
                f"{package!r} ({point.value}) is ignored",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        found[point.name] = candidate
    return found


def families() -> dict[str, KernelFamily]:
    """name -> family, every installed one (discovered once per process)."""
    global _families
    with _lock:
        if _families is None:
            _families = _discover()
        return _families


def forget_families() -> None:
    """Discover again on next use (after installing a family package into a running process)."""
    global _families
    with _lock:
        _families = None
    source_hash.cache_clear()


def family(name: str) -> KernelFamily:
    """The installed family called `name`."""
    found = families().get(name)
    if found is None:
        known = ", ".join(families()) or "none"
        raise UnsupportedProblemError(
            f"unknown kernel family {name!r}; installed: {known} "
            f"(families register under the entry-point group {ENTRY_POINT_GROUP!r})"
        )
    return found


@functools.cache
def source_hash(name: str) -> str:
    """sha256 over the family's source and data files: a bundle built from other sources is stale."""
    found = family(name)
    # The package holding the family's class: its own folder (a package's __package__ is itself).
    package = found.source_package or sys.modules[type(found).__module__].__package__
    digest = hashlib.sha256()
    folder = resources.files(package)
    for item in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if item.is_file() and item.name.endswith((".py", ".json")):
            digest.update(item.name.encode() + b"\0" + item.read_bytes() + b"\0")
    return digest.hexdigest()


def family_facts(name: str) -> dict:
    """What a bundle records about a family it holds, and what staleness compares at load."""
    found = family(name)
    return {"version": found.version, "source_hash": source_hash(name), "abi": found.abi_record()}
