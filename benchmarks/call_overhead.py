"""Per-call overhead on a hit: our op vs the bare TVM-FFI function vs torch F.linear (eager).

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


def per_call_us(fn, calls: int = 20000, repeats: int = 5) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(samples)


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option(
    "--out", "out_path", default="benchmarks/results/call_overhead.json", show_default=True
)
def main(bundles, out_path):
    from cute_aot.kernels.router_gemm import dispatch
    from cute_aot.runtime import REGISTRY, load_bundles, router_gemm
    from cute_aot.runtime.device import current_gpu_arch

    load_bundles(bundles)
    arch = current_gpu_arch()
    m, k, n = 1, 7168, 256
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda")
    direct = REGISTRY.resolve(dispatch(m, k, n, arch), arch)
    results = {
        "op_out": per_call_us(lambda: router_gemm(x, w, out=out)),
        "op_alloc": per_call_us(lambda: router_gemm(x, w)),
        "tvm_ffi_direct": per_call_us(lambda: direct(x, w, out)),
        "torch_linear_bf16": per_call_us(lambda: F.linear(x, w)),
    }
    results["op_over_direct"] = results["op_out"] / results["tvm_ffi_direct"]
    report = {"problem": [m, k, n], "us_per_call": results, "gpu": torch.cuda.get_device_name()}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
