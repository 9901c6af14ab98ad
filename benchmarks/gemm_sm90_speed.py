"""Hopper GEMM families vs cuBLAS, same run, CUDA graphs: F.linear (bf16), torch._scaled_mm (fp8).

For every default (N, K) and M bucket, both sides compute bf16(x @ w^T * scales + bias). Each
figure is the median over replays of a CUDA graph of many calls that cycle through enough copies
of the operands to leave L2 (a server's weights are not in L2 when a layer starts). With
--tactics-max-m, every tactic in the bundles is timed too (the data a tuned table is made from).

    python benchmarks/gemm_sm90_speed.py --bundles bundles --tactics-max-m 4096 \
        --out benchmarks/results/gemm_sm90_speed.json
    python benchmarks/gemm_sm90_speed.py --plot benchmarks/results/gemm_sm90_speed.json  # PNG
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from cute_aot.runtime.tuning.timing import operand_copies, seconds_per_call


def _operands(torch, dtype: str, m: int, n: int, k: int, copies: int):
    gen = torch.Generator(device="cuda").manual_seed(m * 131 + n * 7 + k)
    sets = []
    for _ in range(copies):
        x = torch.randn(m, k, device="cuda", generator=gen)
        w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
        bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).bfloat16()
        if dtype == "bfloat16":
            sets.append((x.bfloat16(), w.bfloat16(), bias))
        else:
            x_scale = torch.tensor([0.125], device="cuda")
            w_scale = torch.tensor([1 / 64], device="cuda")
            x8, w8 = (x * 8).to(torch.float8_e4m3fn), (w * 64).to(torch.float8_e4m3fn)
            sets.append((x8, w8, x_scale, w_scale, bias))
    return sets


def _cublas(torch, dtype: str):
    """F.linear's cuBLAS(Lt) call with the bias in its epilogue, written into `out`; fp8 with
    fast accumulation, as our kernel accumulates (no periodic promotion to full fp32)."""
    if dtype == "bfloat16":
        return lambda x, w, bias, out: torch.addmm(bias, x, w.T, out=out)

    def scaled(x, w, x_scale, w_scale, bias, out):
        torch._scaled_mm(x, w.T, scale_a=x_scale, scale_b=w_scale, bias=bias,
                         out_dtype=torch.bfloat16, use_fast_accum=True, out=out)  # fmt: skip

    return scaled


def _geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def measure(
    bundles: str, tactics_max_m: int, max_m: int, shapes_limit: int | None, out_path: Path
) -> dict:
    """Rows as they are measured; the JSON is rewritten after each (a cut-off run keeps them)."""
    import torch

    from cute_aot.kernels import family
    from cute_aot.kernels.gemm_sm90 import DEFAULT_SHAPES, M_BUCKETS, GemmProblem
    from cute_aot.runtime import REGISTRY, load_bundles

    load_bundles(bundles)
    arch = "sm_90a"
    rows = []
    for family_name in ("gemm_sm90", "gemm_sm90_fp8"):
        found = family(family_name)
        dtype = found.dtype
        built = sorted(
            {
                found.Key.from_fields(entry.key)
                for bundle in REGISTRY.bundles
                for entry in bundle.manifest.entries
                if entry.family == family_name and entry.key["has_bias"]
            },
            key=lambda key: key.canonical_json(),
        )
        baseline = _cublas(torch, dtype)
        for n, k in DEFAULT_SHAPES[:shapes_limit]:
            for m in (m for m in M_BUCKETS if m <= max_m):
                copies = operand_copies((m * k + n * k) * (2 if dtype == "bfloat16" else 1))
                sets = _operands(torch, dtype, m, n, k, copies)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                problem = GemmProblem(m, n, k, dtype, True)
                chosen = found.dispatch(problem, arch).key
                ours = REGISTRY.resolve(chosen, arch, {})
                ours_s = seconds_per_call(ours, sets, out)
                ours_out = out.clone()
                cublas_s = seconds_per_call(baseline, sets, out)
                diff = (ours_out.float() - out.float()).abs().max().item()
                row = {
                    "family": family_name, "m": m, "n": n, "k": k, "key": chosen.describe(),
                    "ours_us": ours_s * 1e6, "cublas_us": cublas_s * 1e6,
                    "speedup": cublas_s / ours_s,
                    "ours_tflops": 2 * m * n * k / ours_s / 1e12,
                    "cublas_tflops": 2 * m * n * k / cublas_s / 1e12,
                    "max_abs_diff_vs_cublas": diff, "operand_copies": copies,
                }  # fmt: skip
                if m <= tactics_max_m:
                    row["tactics_us"] = {
                        key.describe(): seconds_per_call(REGISTRY.resolve(key, arch, {}), sets, out)
                        * 1e6
                        for key in built
                    }
                rows.append(row)
                print(
                    f"{family_name:14s} M={m:5d} N={n:5d} K={k:5d}  ours {row['ours_us']:9.1f} us"
                    f"  cuBLAS {row['cublas_us']:9.1f} us  x{row['speedup']:.2f}  "
                    f"({row['ours_tflops']:.0f} vs {row['cublas_tflops']:.0f} TFLOP/s)",
                    flush=True,
                )
                _write(out_path, torch, rows)
                del sets, out
                torch.cuda.empty_cache()
    return _write(out_path, torch, rows)


def _write(path: Path, torch, rows) -> dict:
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
              "summary": summarize(rows)}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return report


def summarize(rows) -> dict:
    """Geomean speedup vs cuBLAS (>1: ours faster) per family, for M <= 64 and M >= 512."""
    summary = {}
    for family_name in sorted({row["family"] for row in rows}):
        mine = [row for row in rows if row["family"] == family_name]
        summary[family_name] = {
            "geomean_speedup_m_le_64": _geomean(r["speedup"] for r in mine if r["m"] <= 64),
            "geomean_speedup_m_ge_512": _geomean(r["speedup"] for r in mine if r["m"] >= 512),
            "worst": min(mine, key=lambda r: r["speedup"])["speedup"],
            "best_tactic_speedup_geomean": _geomean(
                r["cublas_us"] / min(r["tactics_us"].values()) for r in mine if "tactics_us" in r
            ),
        }
    return summary


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({row["family"] for row in report["rows"]})
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
    for ax, family_name in zip(axes[0], families, strict=True):
        rows = [row for row in report["rows"] if row["family"] == family_name]
        for n, k in sorted({(r["n"], r["k"]) for r in rows}):
            mine = sorted((r for r in rows if (r["n"], r["k"]) == (n, k)), key=lambda r: r["m"])
            ax.plot([r["m"] for r in mine], [r["speedup"] for r in mine], marker=".", lw=1,
                    label=f"N={n} K={k}")  # fmt: skip
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M")
        ax.set_ylabel("cuBLAS time / ours (CUDA graphs)")
        ax.set_title(f"{family_name} on {report['gpu']}")
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option(
    "--tactics-max-m", default=0, show_default=True,
    help="Also time every tactic built into the bundles, for M up to this.",
)  # fmt: skip
@click.option("--max-m", default=16384, show_default=True)
@click.option("--shapes", "shapes_limit", type=int, default=None, help="First N default shapes.")
@click.option("--out", "out_path", default="benchmarks/results/gemm_sm90_speed.json")
@click.option("--plot", "plot_from", type=click.Path(exists=True), help="Only plot this JSON.")
def main(bundles, tactics_max_m, max_m, shapes_limit, out_path, plot_from):
    if plot_from:
        plot(json.loads(Path(plot_from).read_text()), Path(plot_from).with_suffix(".png"))
        return
    report = measure(bundles, tactics_max_m, max_m, shapes_limit, Path(out_path))
    print(json.dumps(report["summary"], indent=1))
    try:
        plot(report, Path(out_path).with_suffix(".png"))
    except ImportError:
        print("matplotlib is not installed: plot later with --plot", out_path)


if __name__ == "__main__":
    main()
