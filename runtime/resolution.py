"""The fallback ladder walked for one problem, as runtime/policy.py decides it:

    mode auto:  bundle -> overlay cache -> JIT (published to the overlay) -> torch reference
    mode aot:   bundle; a miss or a failure raises, naming the family, key, architecture and files
    mode jit:   JIT only (bundles and the overlay are bypassed)

Every decision and every count is the policy's; this module only takes the steps in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from cute_aot.artifacts.core.errors import JitUnavailableError, UnsupportedProblemError
from cute_aot.artifacts.core.notices import warn_once
from cute_aot.runtime import jit
from cute_aot.runtime.misses import record_miss
from cute_aot.runtime.policy import (
    BYPASS,
    HIT,
    MISS,
    bypassed,
    count,
    decided_mode,
    degrade,
    failure,
    falls_back,
    prebuilt_only,
)
from cute_aot.runtime.registry import REGISTRY


class Resolution(NamedTuple):  # a tuple: made on every served call's first use
    function: Callable | None  # None: the served library compiles it itself
    source: str  # "bundle" | "overlay" | "jit" | "reference" | "library"


def resolve(
    family: str,
    arch: str,
    find_key: Callable[[], Any],
    details: Callable[[], dict] | None = None,
    reference: Callable[[], Callable] | None = None,
    serves_library: str | None = None,
) -> Resolution:
    """The function serving one problem on `arch`.

    `find_key()` gives the problem's key (UnsupportedProblemError: no kernel of the family serves
    it); `details()` describes the problem for messages and the miss log; `reference()` gives
    the torch fallback (None: there is none); `serves_library`: the family serves that library's
    function, whose own compile is the step after the bundle.
    """
    mode = decided_mode()  # once: every step below decides for the same mode
    try:
        key = find_key()
    except UnsupportedProblemError as exc:
        if reference is None or not falls_back(mode):
            raise
        degrade(family, (arch, str(exc)), f"{exc}; {family} runs its torch reference instead")
        return Resolution(reference(), "reference")

    if bypassed(mode):
        count(family, BYPASS)
        if serves_library is not None:
            return Resolution(None, "library")
        return Resolution(jit.compiled_function(key, arch, publish=False), "jit")

    try:
        function = REGISTRY.bundle_function(key.FAMILY, key.id, arch, key)
    except Exception as exc:  # a damaged entry, a library that cannot be read: next step
        if prebuilt_only(mode):
            raise
        function = None
        degrade(
            family,
            ("bundle", arch, key.id),
            f"bundle kernel {key.id} of {family} for {arch} is unusable ({failure(exc)}); "
            "falling back",
        )
    if function is not None:
        count(family, HIT)
        return Resolution(function, "bundle")
    if prebuilt_only(mode):
        raise REGISTRY.not_found(key, arch)

    problem = details() if details is not None else {}
    if serves_library is not None:
        count(family, MISS)
        record_miss(key, arch, problem)
        warn_once(
            ("library-compiles", arch, key.id),
            f"no prebuilt {family} kernel for {problem or key.describe()} on {arch} (key "
            f"{key.id}); {serves_library} compiles it itself; recording the miss",
        )
        return Resolution(None, "library")

    try:
        function = REGISTRY.overlay_function(key, arch)
    except Exception as exc:  # an unwritable, full or damaged overlay folder: compile instead
        function = None
        degrade(
            family,
            ("overlay", arch),
            f"overlay cache unusable for {family} on {arch} ({failure(exc)}); compiling instead",
        )
    if function is not None:
        count(family, HIT)
        return Resolution(function, "overlay")

    count(family, MISS)
    record_miss(key, arch, problem)
    what = "compiling it now (JIT)" if jit.jit_available() else "JIT is not installed"
    warn_once(
        ("miss", arch, key.id),
        f"no prebuilt {family} kernel for {problem or key.describe()} on {arch} (key "
        f"{key.id}); {what}; recording the miss",
    )
    try:
        return Resolution(jit.compiled_function(key, arch, publish=True), "jit")
    except Exception as exc:  # no compiler, a broken cutlass-dsl, a compile error
        error = (
            exc
            if isinstance(exc, JitUnavailableError)
            else JitUnavailableError(
                f"JIT of {family} key {key.id} for {arch} failed: {failure(exc)}"
            )
        )
        if reference is None:
            raise error from (None if error is exc else exc)
        degrade(
            family,
            ("jit", arch, str(error)),
            f"{error}; {family} runs its torch reference instead",
        )
        return Resolution(reference(), "reference")


def key_function(key, arch: str, problem: dict | None = None) -> Callable:
    """The function serving `key` on `arch` by the same ladder; no torch reference here: a miss
    that cannot be compiled raises JitUnavailableError."""
    return resolve(key.FAMILY, arch, lambda: key, lambda: problem or {}).function
