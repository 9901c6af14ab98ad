"""JIT fallback: compile a missing kernel in this process (cutlass is imported here, lazily).

cute.compile is a process-wide singleton and not thread-safe: every compile holds one lock, and
concurrent misses of one key wait for the first one's result instead of compiling again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from cute_aot.artifacts.core.atomic import scratch_folder
from cute_aot.artifacts.core.errors import JitUnavailableError
from cute_aot.kernels import bundle_facts, family
from cute_aot.runtime import overlay, policy

_compile_lock = threading.Lock()
_table_lock = threading.Lock()
_results: dict[tuple[str, str], Future] = {}
compile_count = 0  # compiles done by this process (tests and benchmarks read it)
published: list[str] = []  # key ids this process published to the overlay


def jit_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("cutlass") is not None


def compiled_function(key, arch: str, publish: bool) -> Callable:
    """The kernel of `key` for `arch`, compiled once per process; published to the overlay."""
    slot = (arch, key.id)
    with _table_lock:
        future = _results.get(slot)
        owner = future is None
        if owner:
            future = _results[slot] = Future()
    if not owner:
        return future.result()
    try:
        function = _compile(key, arch, publish)
    except BaseException as exc:
        with _table_lock:
            _results.pop(slot, None)
        future.set_exception(exc)
        raise
    future.set_result(function)
    return function


def _compile(key, arch: str, publish: bool) -> Callable:
    global compile_count
    if not jit_available():
        raise JitUnavailableError(
            f"cannot JIT-compile {key.FAMILY} key {key.id} for {arch}: nvidia-cutlass-dsl is not "
            "installed (pip install 'cute-aot[build]')"
        )
    with _compile_lock:
        compiled = family(key.FAMILY).compile(key, arch)
        compile_count += 1
        if publish:
            _publish(compiled, key, arch)
    return compiled


def _publish(compiled, key, arch: str) -> None:
    """Export, link and publish as a one-kernel bundle. Any failure (an unwritable or full
    folder, an export or link error) only turns the overlay off: the compiled kernel serves."""
    try:
        from cute_aot.artifacts.export import export_object
        from cute_aot.artifacts.pack import pack_bundle

        with scratch_folder("cute-aot-jit") as scratch:
            row = export_object(compiled, key, scratch)
            facts = bundle_facts({key.FAMILY}, arch)
            _, bundle = pack_bundle(f"overlay-{key.id}", arch, {key: row}, facts, sign=overlay.sign)
        if overlay.publish(key, arch, bundle):
            published.append(key.id)
    except Exception as exc:
        policy.degrade(
            key.FAMILY,
            ("overlay-publish", str(overlay.overlay_root())),
            f"overlay cache off: cannot publish JIT results under {overlay.overlay_root()} "
            f"({type(exc).__name__}: {exc}); the compiled kernel serves this process",
        )


def forget_compiled() -> None:
    """Drop this process's compiled kernels (tests: each starts from an empty JIT cache)."""
    with _table_lock:
        _results.clear()
