"""The server-side loader: bundles -> shape -> key -> prebuilt kernel. Never imports cutlass
unless a kernel is missing and the mode allows compiling it.

    from cute_aot.runtime import load_bundles, op
    load_bundles("bundles/")            # or set CUTE_AOT_BUNDLES
    out = op(FAMILY)(x, w)              # every installed family is also an attribute of its name:
                                        # `from cute_aot.runtime import <family>`

Names are imported on first use, so tools that only read bundles (`aot-cache`, `aot-build`)
do not pay for torch. Importing it activates nothing: recording and serving by the environment
are the startup hook's (runtime/capture/activation.py).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LoadedBundle": "cute_aot.runtime.loader",
    "open_bundle": "cute_aot.runtime.loader",
    "Mode": "cute_aot.runtime.mode",
    "current_mode": "cute_aot.runtime.mode",
    "op": "cute_aot.runtime.ops",
    "forget_resolutions": "cute_aot.runtime.ops",
    "counters": "cute_aot.runtime.policy",
    "REGISTRY": "cute_aot.runtime.registry",
    "load_bundles": "cute_aot.runtime.registry",
    "StaleBundleError": "cute_aot.artifacts.core.errors",
    "preload": "cute_aot.runtime.warmup",
    "preload_model": "cute_aot.runtime.warmup",
    "model_shapes": "cute_aot.runtime.warmup",
    "intercept": "cute_aot.runtime.compile_hook",
}
__all__ = [*_EXPORTS, "set_mode"]


def set_mode(mode) -> None:
    """Set the process-wide mode (auto | aot | jit; None: CUTE_AOT_MODE) for the next calls."""
    from cute_aot.runtime import mode as _mode

    _mode.set_mode(mode)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        from cute_aot.kernels import registered

        # `from cute_aot.runtime import loader` asks for a submodule not imported yet: that is
        # no family's name, and must not import every family to find out.
        if name.startswith("_") or not registered(name):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from cute_aot.runtime.ops import op

        value = op(name)  # a kernel family's op, made from its contract
    globals()[name] = value
    return value
