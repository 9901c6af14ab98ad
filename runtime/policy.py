"""The one fallback policy, as pure decisions: which source serves a kernel, in which order, and
which failures mean "try the next one". runtime/resolution.py walks the ladder these decide.

    mode auto:  bundle -> overlay cache -> JIT (published to the overlay) -> torch reference
    mode aot:   bundle; a miss or a failure raises, naming the family, key, architecture and files
    mode jit:   JIT only (bundles and the overlay are bypassed)

For a family that serves another library's function (FlashInfer's), the step after the bundle is
that library's own compile: the resolution's function is None.

In mode auto every failure of a cache, a store or an export (a damaged bundle entry, an
unwritable or full cache folder, an export error, a broken compiler) degrades to the next step
with one warning and one count; the call itself never fails because of a cache. Only an explicit
request that cannot be met raises: mode aot, mode jit without a compiler, or mode auto with no
step left (no compiler and no reference).

A bundle that cannot be loaded (stale, damaged, a source that cannot be read, another
architecture's) is decided here too, by `on_load_failure`; a `cute.compile` call no kernel can
serve, by `unservable`. Nothing else in the package tests the mode (tests/test_one_policy.py).

The counters live here only: per family (hits, misses, bypasses, degradations), `counters()`;
per `cute.compile` target (compiles, hits, misses), `targets()`; both in this process (`aot-cache
env`, another process, has none to show).
"""

from __future__ import annotations

import threading
from collections import Counter

from cute_aot.artifacts.core.errors import KernelNotFoundError
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.runtime.mode import Mode, current_mode, parse_mode

HIT = "hits"  # served from a bundle or the overlay
MISS = "misses"  # no prebuilt kernel: compiled here (or by the served library)
BYPASS = "bypasses"  # mode jit: prebuilt kernels ignored on purpose
DEGRADED = "degradations"  # a failure, or a problem no kernel serves, fell to the next step
COMPILED = "compiles"  # per target: a real `cute.compile` execution
TARGET_OUTCOMES = (COMPILED, HIT, MISS)

_counts: dict[str, Counter] = {}
_targets: dict[str, dict[str, int]] = {}  # `module:function` compiled -> TARGET_OUTCOMES
_counts_lock = threading.Lock()


def count(family: str, outcome: str, target: str | None = None) -> None:
    """Count `outcome` for `family`, and for the `cute.compile` target too where one is given
    (one lock for both: the served compile's hit path counts so). Nothing is allocated once
    the family and the target were counted before."""
    with _counts_lock:
        counted = _counts.get(family)
        if counted is None:
            counted = _counts[family] = Counter()
        counted[outcome] += 1
        if target is not None:
            _add_to_target(target, outcome)


def count_target(target: str, outcome: str) -> None:
    """Count `outcome` (compiles, hits, misses) for a `cute.compile` target."""
    with _counts_lock:
        _add_to_target(target, outcome)


def _add_to_target(target: str, outcome: str) -> None:
    """The target's count of `outcome`, one more (the caller holds _counts_lock)."""
    counts = _targets.get(target)
    if counts is None:
        counts = _targets[target] = dict.fromkeys(TARGET_OUTCOMES, 0)
    counts[outcome] += 1


def family_count(family: str, outcome: str) -> int:
    with _counts_lock:
        counted = _counts.get(family)
        return counted[outcome] if counted is not None else 0


def counters() -> dict[str, dict[str, int]]:
    """family -> {hits, misses, bypasses, degradations} in this process."""
    with _counts_lock:
        return {
            name: {k: counted[k] for k in (HIT, MISS, BYPASS, DEGRADED)}
            for name, counted in sorted(_counts.items())
        }


def reset_counters() -> None:
    with _counts_lock:
        _counts.clear()


def targets() -> dict[str, dict[str, int]]:
    """`cute.compile` target -> {compiles, hits, misses} in this process."""
    with _counts_lock:
        return {target: dict(counts) for target, counts in sorted(_targets.items())}


def reset_targets() -> None:
    with _counts_lock:
        _targets.clear()


# -- load time: a bundle, or a source of them, that cannot be loaded ------------------------------
STALE = "stale"  # built for another family version, ABI, sources, libraries or compiler
DAMAGED = "damaged"  # corrupt, untrusted or incompatible; a store's object refused
UNREACHABLE = "unreachable"  # a source that cannot be read now (tried again later)
ABSENT = "absent"  # a source that does not exist (yet): a folder not mounted, tried again later
OTHER_ARCH = "other architecture"  # another GPU's bundle

RAISE = "raise"  # the error reaches the caller
FALL_BACK = "fall back"  # skipped, said once by the caller; its kernels come from the next step
IGNORE = "ignore"  # skipped without a word: never meant for this GPU


def decided_mode(mode: str | Mode | None = None) -> Mode:
    """The mode a decision is made for: `mode` as given (a tool explaining what a server in that
    mode would do: `aot-cache explain --mode`), else this process's current one."""
    if mode is None:
        return current_mode()
    return parse_mode(mode)


def on_load_failure(
    kind: str, *, named: bool = False, in_folder: bool = False, mode: str | Mode | None = None
) -> str:
    """RAISE, FALL_BACK or IGNORE for a bundle (or bundle source) that failed to load as `kind`.

    `named`: the caller named this very file (`load_bundles(path)`): an explicit request that
    cannot be met, so it raises in every mode. `in_folder`: found in a folder, which usually
    ships every architecture. Otherwise mode aot raises (every bundle it is given must serve) and
    mode auto and jit fall back; a source that does not exist yet never fails. `mode`: decide for
    that mode instead of the current one.
    """
    if named:
        return RAISE
    if kind == OTHER_ARCH and in_folder:
        return IGNORE
    if kind == ABSENT:
        return FALL_BACK
    return RAISE if prebuilt_only(mode) else FALL_BACK


# -- call time ---------------------------------------------------------------------------------
def bypassed(mode: str | Mode | None = None) -> bool:
    """Whether prebuilt kernels are ignored on purpose (mode jit): the caller compiles. `mode`:
    for that mode instead of the current one."""
    # current_mode() directly where no mode is named: the served compile's hit path asks this
    return (current_mode() if mode is None else decided_mode(mode)) is Mode.JIT


def falls_back(mode: str | Mode | None = None) -> bool:
    """Whether a problem no kernel can serve falls to the next step (mode auto: a torch
    reference) instead of raising. `mode`: for that mode instead of the current one."""
    return decided_mode(mode) is Mode.AUTO


def prebuilt_only(mode: str | Mode | None = None) -> bool:
    """Whether only prebuilt kernels may serve (mode aot): a miss, a kernel that fails and a
    bundle that cannot be loaded raise instead of falling to the next step. `mode`: for that
    mode instead of the current one."""
    return (current_mode() if mode is None else decided_mode(mode)) is Mode.AOT


def unservable(family: str, key_id: str, arch: str, why: str, subject: tuple, message: str) -> None:
    """A call no prebuilt kernel can serve whatever is loaded (it cannot be described, or no
    kernel fits this hardware): mode aot raises KernelNotFoundError; otherwise `message` is said
    once per `subject` and the caller compiles it as it would without cute-aot."""
    if prebuilt_only():
        raise KernelNotFoundError(family, key_id, arch, [], detail=f"{why}; mode aot")
    warn_once(subject, message)


def degrade(family: str, subject: tuple, message: str) -> None:
    """A step failed and the next one serves: counted, and said once per subject."""
    count(family, DEGRADED)
    warn_once(("degraded", family, *subject), message)


def failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


__all__ = [
    "ABSENT",
    "BYPASS",
    "COMPILED",
    "DAMAGED",
    "DEGRADED",
    "FALL_BACK",
    "HIT",
    "IGNORE",
    "MISS",
    "OTHER_ARCH",
    "RAISE",
    "STALE",
    "UNREACHABLE",
    "bypassed",
    "count",
    "count_target",
    "counters",
    "decided_mode",
    "degrade",
    "failure",
    "falls_back",
    "family_count",
    "on_load_failure",
    "prebuilt_only",
    "reset_counters",
    "reset_targets",
    "targets",
    "unservable",
]
