"""Serving another library's public functions from bundles: families with `serves` (FlashInfer's
CuTe DSL kernels) patch the places where that library looks its compiled kernels up.

The library keeps its own API, checks and launch code; only the lookup of a compiled function
changes. On a hit it gets the bundle's function; on a miss mode auto lets the library compile as
before (said once, recorded in the miss log for the next build), mode aot raises, mode jit never
looks at bundles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from cute_aot.artifacts.core.errors import CuteAotError
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.kernels import Adapter, KernelFamily, Patch, capability, families
from cute_aot.runtime import policy, resolution
from cute_aot.runtime.epoch import Resolutions

__all__ = ["Serving", "install", "installed", "uninstall"]


class Serving:
    """What a family's patches ask of cute-aot: the prebuilt function of a key, by mode."""

    def __init__(self, kernel_family: KernelFamily):  # an Adapter
        self.family = kernel_family

    # The policy's counters of the family, the only ones (tests and benchmarks read them here).
    @property
    def hits(self) -> int:
        """Lookups served from a bundle in this process."""
        return policy.family_count(self.family.name, policy.HIT)

    @property
    def misses(self) -> int:
        """Lookups no bundle served, left to the library's own compile (mode jit aside)."""
        return policy.family_count(self.family.name, policy.MISS)

    @staticmethod
    def resolutions() -> Resolutions:
        """A table for a family that keeps its own resolved functions: empty again whenever
        bundles are loaded or cleared or the mode changes (runtime/epoch.py)."""
        return Resolutions()

    def function(
        self, key, arch: str, problem: dict | Callable[[], dict] | None = None
    ) -> Callable | None:
        """The bundle's function for `key` on `arch`, or None where the library should compile
        it itself (mode auto: a miss, said once and recorded; a bundle that fails; mode jit).
        Mode aot raises KernelNotFoundError on a miss. `problem`, or a function giving it: what
        a miss records (a hit never asks)."""
        details = problem if callable(problem) else (lambda: problem or {})
        return resolution.resolve(
            key.FAMILY, arch, lambda: key, details, serves_library=self.family.serves
        ).function


_lock = threading.Lock()
# family name -> (its Serving, [(owner, attribute, original)]) for what is patched now
_installed: dict[str, tuple[Serving, list[tuple[object, str, object]]]] = {}


def install(wanted: Iterable[str] | None = None, *, library: str | None = None) -> dict[str, str]:
    """Patch the libraries served by the installed families (those named in `wanted`, or those
    serving `library`, or all). Returns {family: "installed"} or {family: why not}; a family
    whose library cannot be patched (another version, a changed function) is left out with one
    warning, and the library then compiles as before."""
    outcome = {}
    with _lock:
        for name, installed_family in families().items():
            found = capability(installed_family, Adapter)
            if found is None or (wanted is not None and name not in wanted):
                continue
            if library is not None and found.serves.split(".")[0] != library:
                continue
            if name in _installed:
                outcome[name] = "installed"
                continue
            why = installed_family.missing_requirements()
            if why is None:
                serving = Serving(installed_family)
                try:
                    patches = found.patches(serving)
                    _installed[name] = (serving, _apply(patches))
                    outcome[name] = "installed"
                    continue
                except (CuteAotError, ImportError, AttributeError, TypeError) as exc:
                    why = f"{found.serves} cannot be patched: {type(exc).__name__}: {exc}"
            outcome[name] = why
            warn_once(("serving-off", name), f"{name} serves no prebuilt kernels ({why})")
    return outcome


def _apply(patches: list[Patch]) -> list[tuple[object, str, object]]:
    """Replace every attribute, or none (a failure undoes the ones already replaced)."""
    done = []
    try:
        for patch in patches:
            original = getattr(patch.owner, patch.attribute)
            setattr(patch.owner, patch.attribute, patch.replace(original))
            done.append((patch.owner, patch.attribute, original))
    except BaseException:
        _undo(done)
        raise
    return done


def _undo(done: list[tuple[object, str, object]]) -> None:
    for owner, attribute, original in reversed(done):
        setattr(owner, attribute, original)


def uninstall(wanted: Iterable[str] | None = None) -> None:
    """Put the originals back (tests; a server never needs it)."""
    with _lock:
        for name in list(_installed):
            if wanted is None or name in wanted:
                _undo(_installed.pop(name)[1])


def installed(name: str) -> Serving | None:
    """The Serving of an installed family (its hit and miss counts), None when not installed."""
    found = _installed.get(name)
    return found[0] if found else None
