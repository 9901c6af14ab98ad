"""Run one GEMM problem through our kernel and through cuBLAS, a few times each, for a profiler.

    ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size \
        --csv python benchmarks/gemm_profile.py --bundles bundles --m 16 --n 4096 --k 4096

Prints which key our dispatch chose, so each profiled kernel can be named.
"""

from __future__ import annotations

import click


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option("--family", "family_name", default="gemm_sm90", show_default=True)
@click.option("--m", type=int, required=True)
@click.option("--n", type=int, required=True)
@click.option("--k", type=int, required=True)
@click.option("--repeat", default=3, show_default=True)
def main(bundles, family_name, m, n, k, repeat):
    import torch

    from cute_aot.kernels import family
    from cute_aot.kernels.gemm_sm90 import GemmProblem
    from cute_aot.runtime import load_bundles
    from cute_aot.runtime.resolution import key_function

    load_bundles(bundles)
    found = family(family_name)
    problem = GemmProblem(m, n, k, found.dtype, True)
    key = found.dispatch(problem, "sm_90a").key
    print(f"{family_name} M={m} N={n} K={k}: {key.describe()}", flush=True)
    ours = found.bind(key_function(key, "sm_90a", {}), problem)
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda").bfloat16()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if found.dtype == "bfloat16":
        x, w = x.bfloat16(), w.bfloat16()
        args = (x, w, bias)
        cublas = lambda: torch.addmm(bias, x, w.T, out=out)  # noqa: E731
    else:
        x, w = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        scale = torch.ones(1, device="cuda")
        args = (x, w, scale, scale, bias)
        cublas = lambda: torch._scaled_mm(  # noqa: E731
            x,
            w.T,
            scale_a=scale,
            scale_b=scale,
            bias=bias,
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
            out=out,
        )
    for _ in range(repeat):
        ours(*args, out)
        cublas()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
