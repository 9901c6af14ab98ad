"""The server-side loader: bundles -> shape -> key -> prebuilt kernel. Never imports cutlass
unless a kernel is missing and the mode allows compiling it.

    from cute_aot.runtime import load_bundles, router_gemm
    load_bundles("bundles/")            # or set CUTE_AOT_BUNDLES
    logits = router_gemm(x, w)          # x [M, K] bf16, w [N, K] bf16 -> [M, N] fp32
"""

from cute_aot.runtime import mode as _mode
from cute_aot.runtime.loader import LoadedBundle, open_bundle
from cute_aot.runtime.mode import Mode, current_mode
from cute_aot.runtime.ops import forget_resolutions, router_gemm
from cute_aot.runtime.registry import REGISTRY, StaleBundleError, load_bundles
from cute_aot.runtime.warmup import preload, preload_model, router_shapes


def set_mode(mode: str | Mode | None) -> None:
    """Set the process-wide mode (auto | aot | jit; None: CUTE_AOT_MODE) for the next calls."""
    _mode.set_mode(mode)
    forget_resolutions()


__all__ = [
    "REGISTRY",
    "LoadedBundle",
    "Mode",
    "StaleBundleError",
    "current_mode",
    "load_bundles",
    "open_bundle",
    "preload",
    "preload_model",
    "router_gemm",
    "router_shapes",
    "set_mode",
]
