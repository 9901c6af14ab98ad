"""Per-call overhead on a hit: our op vs the bare TVM-FFI function vs torch F.linear (eager).

The methods are timed in short turns (op, bare, op, bare, ...) so that clock and cache drift land
on all of them alike; each figure is the median of its turns, and the op's overhead is also given
as the median of its per-turn ratios to the bare call (the host's speed drifts between modes
within a run; a ratio of neighbours cancels it).

python benchmarks/call_overhead.py --bundles bundles --out benchmarks/results/call_overhead.json
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click
import torch
import torch.nn.functional as F


def time_per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option("--calls", default=5000, show_default=True)
@click.option("--turns", default=61, show_default=True)
@click.option(
    "--out", "out_path", default="benchmarks/results/call_overhead.json", show_default=True
)
def main(bundles, calls, turns, out_path):
    from cute_aot.kernels import family
    from cute_aot.runtime import load_bundles, op, ops
    from cute_aot.runtime.device import current_gpu_arch
    from cute_aot.runtime.resolution import key_function

    load_bundles(bundles)
    router = family("router_gemm")
    router_gemm = op("router_gemm")
    arch = current_gpu_arch()
    m, n, k = 1, 256, 7168
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda")
    direct = key_function(router.dispatch(router.parse_problem(f"{m},{n},{k}"), arch).key, arch)
    methods = {
        "op_out": lambda: router_gemm(x, w, out=out),
        "op_alloc": lambda: router_gemm(x, w),
        "tvm_ffi_direct": lambda: direct(x, w, out),
        "torch_linear_bf16": lambda: F.linear(x, w),
    }
    for fn in methods.values():  # warm-up: resolution, allocator, caches
        time_per_call_us(fn, 500)
    samples = {name: [] for name in methods}
    for _ in range(turns):
        for name, fn in methods.items():
            samples[name].append(time_per_call_us(fn, calls))
    results = {name: statistics.median(values) for name, values in samples.items()}
    results["op_over_direct"] = results["op_out"] / results["tvm_ffi_direct"]
    results["op_over_direct_paired"] = statistics.median(
        op / bare for op, bare in zip(samples["op_out"], samples["tvm_ffi_direct"], strict=True)
    )
    results["c_hit_path"] = ops.family_op("router_gemm").dispatcher is not None
    report = {
        "problem": {"m": m, "n": n, "k": k},  # named: a bare list once read (M, K, N)
        "calls_per_turn": calls,
        "turns": turns,
        "us_per_call": results,
        "samples_us": samples,
        "gpu": torch.cuda.get_device_name(),
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
