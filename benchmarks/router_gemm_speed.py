"""Router GEMM kernel speed on the GPU vs cuBLAS, with and without CUDA graphs.

Baselines, measured in the same run on the same inputs (fp32 logits are what a router needs):
  cublas_bf16: F.linear(x, w).float()   (bf16 GEMM, then a cast kernel)
  cublas_fp32: torch.mm(x32, w32.t())   (inputs already fp32; the best case for fp32)
Graph timings replay a CUDA graph of `calls` back-to-back launches and divide; eager timings are
wall clock per Python call. Writes JSON (and a PNG when matplotlib is present).

    python benchmarks/router_gemm_speed.py --bundles bundles \
        --out benchmarks/results/router_gemm_h200.json
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import click
import torch
import torch.nn.functional as F

SHAPES = [(7168, 256), (7168, 384), (4096, 256), (6144, 256), (2880, 128)]


def graph_time_us(fn, calls: int = 50, replays: int = 30) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def eager_time_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


@click.command()
@click.option("--bundles", multiple=True, default=["bundles"], show_default=True)
@click.option("--out", "out_path", default="benchmarks/results/router_gemm.json", show_default=True)
@click.option("--max-m", default=16, show_default=True)
def main(bundles, out_path, max_m):
    from cute_aot.kernels.router_gemm import dispatch
    from cute_aot.runtime import load_bundles, router_gemm
    from cute_aot.runtime.device import current_gpu_arch

    load_bundles(*bundles)
    arch = current_gpu_arch()
    rows = []
    for k, n in SHAPES:
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        w32 = w.float()
        for m in range(1, max_m + 1):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            x32 = x.float()
            out = torch.empty(m, n, device="cuda")
            ours = lambda: router_gemm(x, w, out=out)  # noqa: E731
            bf16 = lambda: F.linear(x, w).float()  # noqa: E731
            fp32 = lambda: torch.mm(x32, w32.t())  # noqa: E731
            row = {"k": k, "n": n, "m": m, "key": dispatch(m, n, k, arch).describe()}
            for name, fn in (("ours", ours), ("cublas_bf16", bf16), ("cublas_fp32", fp32)):
                row[f"{name}_graph_us"] = graph_time_us(fn)
                row[f"{name}_eager_us"] = eager_time_us(fn)
            row["speedup_graph_vs_bf16"] = row["cublas_bf16_graph_us"] / row["ours_graph_us"]
            row["speedup_eager_vs_bf16"] = row["cublas_bf16_eager_us"] / row["ours_eager_us"]
            rows.append(row)
            print(
                f"K={k:5d} N={n:3d} M={m:2d} ours {row['ours_graph_us']:6.2f} us | cuBLAS bf16 "
                f"{row['cublas_bf16_graph_us']:6.2f} | fp32 {row['cublas_fp32_graph_us']:6.2f} | "
                f"x{row['speedup_graph_vs_bf16']:.2f}  [{row['key']}]",
                flush=True,
            )
    summary = {}
    for k, n in SHAPES:
        shape_rows = [r for r in rows if (r["k"], r["n"]) == (k, n)]
        summary[f"{k}x{n}"] = {
            "geomean_speedup_graph_vs_bf16": geomean(
                [r["speedup_graph_vs_bf16"] for r in shape_rows]
            ),
            "min_speedup_graph_vs_bf16": min(r["speedup_graph_vs_bf16"] for r in shape_rows),
            "geomean_speedup_eager_vs_bf16": geomean(
                [r["speedup_eager_vs_bf16"] for r in shape_rows]
            ),
        }
    report = {
        "gpu": torch.cuda.get_device_name(),
        "arch": arch,
        "torch": torch.__version__,
        "rows": rows,
        "summary": summary,
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))
    for shape, facts in summary.items():
        print(
            f"{shape}: geomean x{facts['geomean_speedup_graph_vs_bf16']:.2f} (graph), "
            f"min x{facts['min_speedup_graph_vs_bf16']:.2f}, "
            f"eager x{facts['geomean_speedup_eager_vs_bf16']:.2f}"
        )
    try:
        _plot(rows, Path(out_path).with_suffix(".png"))
    except ImportError:
        pass


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r["k"], r["n"]) for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.2), sharey=True)
    for ax, (k, n) in zip(axes, shapes, strict=True):
        shape_rows = [r for r in rows if (r["k"], r["n"]) == (k, n)]
        ms = [r["m"] for r in shape_rows]
        for name, label in (
            ("ours", "cute-aot"),
            ("cublas_bf16", "cuBLAS bf16+cast"),
            ("cublas_fp32", "cuBLAS fp32"),
        ):
            ax.plot(ms, [r[f"{name}_graph_us"] for r in shape_rows], marker=".", label=label)
        ax.set_title(f"K={k} N={n}")
        ax.set_xlabel("M (tokens)")
    axes[0].set_ylabel("µs per call (CUDA graph)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
