"""Runtime on a real GPU: JIT fallback, overlay reuse across processes, torch.compile, warm-up.

Needs nvidia-cutlass-dsl on the GPU machine (the JIT path compiles there).
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

from cute_aot.kernels.router_gemm import dispatch  # noqa: E402
from tests.test_router_gemm_gpu import _check, _inputs  # noqa: E402

# Read at import, before the fresh_runtime fixture isolates the environment.
BUNDLES = os.environ.get("CUTE_AOT_BUNDLES", "bundles")

pytestmark = pytest.mark.gpu


def _requires_jit():
    """Skip where JIT cannot run (cutlass-dsl not installed); fail where it is installed but
    broken: that is exactly what these tests exist to catch."""
    import importlib.util

    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("needs nvidia-cutlass-dsl on this GPU machine to JIT-compile (not installed)")
    try:
        import cutlass.cute  # noqa: F401
    except Exception as exc:
        pytest.fail(f"nvidia-cutlass-dsl is installed but does not import: {exc!r}")


# K = 2880 (gpt-oss-style router): not in the default bundles, so every call here misses.
MISS_PROBLEMS = [(1, 128, 2880), (3, 128, 2880), (8, 128, 2880), (16, 128, 2880)]  # (M, N, K)


def test_jit_fallback_results_are_correct(fresh_runtime):
    from cute_aot.runtime import jit, router_gemm

    _requires_jit()
    before = jit.compile_count
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m, n, k in MISS_PROBLEMS:
            x, w = _inputs(m, n, k)
            out = router_gemm(x, w)
            torch.cuda.synchronize()
            _check(out, x, w)
    keys = {dispatch(*problem, "sm_90a") for problem in MISS_PROBLEMS}
    misses = [w for w in caught if "compiling it now" in str(w.message)]
    assert len(misses) == len(keys)  # one warning per key, not per call
    assert jit.compile_count - before == len(keys)  # each key compiled once, none fell to torch


PROCESS = textwrap.dedent(
    """
    import json, sys, time, warnings
    import torch
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    from cute_aot.runtime import jit, router_gemm
    results = []
    for m, n, k in {problems!r}:
        x = torch.ones(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(n, k, device="cuda", dtype=torch.bfloat16)
        results.append(router_gemm(x, w).mean().item())
    torch.cuda.synchronize()
    print(json.dumps({{"seconds": time.perf_counter() - start, "compiles": jit.compile_count,
                       "cutlass": "cutlass" in sys.modules, "results": results}}))
    """
).format(problems=MISS_PROBLEMS)


def test_second_process_reuses_the_overlay_without_compiling(tmp_path):
    _requires_jit()
    env = {**__import__("os").environ, "CUTE_AOT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("CUTE_AOT_BUNDLES", None)
    runs = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", PROCESS], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    first, second = runs
    print(
        f"\nfirst process (JIT + publish): {first['seconds']:.2f} s, {first['compiles']} compiles; "
        f"second process (overlay): {second['seconds'] * 1e3:.1f} ms, {second['compiles']} compiles"
    )
    assert first["compiles"] == len({dispatch(*p, "sm_90a") for p in MISS_PROBLEMS})
    assert second["compiles"] == 0 and second["cutlass"] is False
    assert second["results"] == first["results"] == [2880.0] * len(MISS_PROBLEMS)


def test_torch_compile_of_a_module_using_the_op(fresh_runtime):
    from cute_aot.runtime import load_bundles, router_gemm

    load_bundles(BUNDLES)

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(_inputs(1, 256, 7168)[1], requires_grad=False)

        def forward(self, hidden):
            return torch.softmax(router_gemm(hidden, self.weight), dim=-1)

    gate = Gate()
    compiled = torch.compile(gate, fullgraph=True)
    for m in (1, 4, 8, 16):
        x = _inputs(m, 256, 7168)[0]
        expected = gate(x)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-6)


def test_preload_model_resolves_every_router_shape(fresh_runtime):
    from cute_aot.runtime import REGISTRY, load_bundles, preload_model
    from cute_aot.runtime.device import current_gpu_arch
    from cute_aot.runtime.ops import family_op

    load_bundles(BUNDLES)
    model = torch.nn.ModuleDict(
        {
            "mlp": torch.nn.ModuleDict(
                {
                    "gate": torch.nn.Linear(
                        7168, 256, bias=False, dtype=torch.bfloat16, device="cuda"
                    )
                }
            )
        }
    )
    assert preload_model(model) == {"router_gemm": [(256, 7168)]}
    device, arch = torch.cuda.current_device(), current_gpu_arch()
    op = family_op("router_gemm")
    for m in range(1, 17):
        shapes = [torch.Size((m, 7168)), torch.Size((256, 7168))]
        function, out_shape = (
            op.device_table[(*shapes, device)] if op.per_device else op.table[tuple(shapes)]
        )
        # the bundle's own kernel, not a JIT result or the torch fallback
        bundle_function = REGISTRY.bundle_function(
            "router_gemm", dispatch(m, 256, 7168, arch).id, arch
        )
        assert function is bundle_function and out_shape == (m, 256)
