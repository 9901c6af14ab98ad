"""Run with commit 9d40a62's code (see README.txt): one overlay entry, published the way that
commit's JIT publishes one, and a miss log of two keys, written by that commit's record_miss.

    CUTE_AOT_CACHE_DIR=<cache> CUTE_AOT_MISS_LOG=<log> python3 make_overlay_and_misses.py

Needs nvidia-cutlass-dsl (the kernel is compiled for sm_90a on this CPU, as a JIT would).
"""

import json

from cute_aot.kernels import family
from cute_aot.kernels.router_gemm import RouterProblem, dispatch
from cute_aot.runtime import jit, overlay
from cute_aot.runtime.misses import record_miss

ARCH = "sm_90a"
router = family("router_gemm")
# dispatch takes the problem as (M, N, K).
overlay_problem = RouterProblem(m=1, k=4096, n=256)
splitk_problem = RouterProblem(m=12, k=7168, n=256)
overlay_key = dispatch(1, 256, 4096, ARCH)
splitk_key = dispatch(12, 256, 7168, ARCH)

# What the JIT does on a miss in mode auto: compile, then export, pack, sign and publish.
jit.compiled_function(overlay_key, ARCH, publish=True)
assert jit.published == [overlay_key.id], jit.published

record_miss(overlay_key, ARCH, router.describe_problem(overlay_problem))
record_miss(splitk_key, ARCH, router.describe_problem(splitk_problem))

print(
    json.dumps(
        {
            "overlay_key": overlay_key.id,
            "overlay_path": str(overlay.overlay_path(overlay_key, ARCH)),
            "overlay_fingerprint": overlay.fingerprint("router_gemm"),
            "missed": [overlay_key.id, splitk_key.id],
        },
        indent=1,
    )
)
