"""The server-side loader: bundles -> shape -> key -> prebuilt kernel. Never imports cutlass.

from cute_aot.runtime import load_bundles, router_gemm
load_bundles("bundles/")            # or set CUTE_AOT_BUNDLES
logits = router_gemm(x, w)          # x [M, K] bf16, w [N, K] bf16 -> [M, N] fp32
"""

from cute_aot.runtime.loader import LoadedBundle, open_bundle
from cute_aot.runtime.ops import router_gemm
from cute_aot.runtime.registry import REGISTRY, load_bundles

__all__ = ["LoadedBundle", "REGISTRY", "load_bundles", "open_bundle", "router_gemm"]
