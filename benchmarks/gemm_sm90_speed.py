"""Hopper GEMM families vs cuBLAS, same run, CUDA graphs: F.linear (bf16), torch._scaled_mm (fp8).

For every default (N, K), any --shape N,K (shapes nobody tuned for) and every M of --m
(default 1, 2, 4, ..., 8192), both sides compute bf16(x @ w^T * scales + bias). Each figure is
the median over replays of a CUDA graph of many calls that cycle through enough copies of the
operands to leave L2 (a server's weights are not in L2 when a layer starts); ours and cuBLAS
replay in turns, one graph each per round, so clock changes at the power limit weigh on both. With
--tactics-max-m, every tactic in the bundles is timed too (the data a tuned table is made from).
The summary gives the geomean speedup per family in the bands M <= 64, 128-256 and >= 512.

    python benchmarks/gemm_sm90_speed.py --bundles bundles --shape 2560,2048 \
        --out benchmarks/results/gemm_sm90_speed.json
    python benchmarks/gemm_sm90_speed.py --plot benchmarks/results/gemm_sm90_speed.json  # PNG
    python benchmarks/gemm_sm90_speed.py --compare new.json old.json  # same problems, new/old
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from cute_aot.aot.tools.aot_tune.timing import (
    operand_copies,
    seconds_per_call,
    seconds_per_call_each,
)


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


DEFAULT_MS = tuple(2**i for i in range(14))  # 1 .. 8192
BANDS = (("m_le_64", 1, 64), ("m_128_256", 128, 256), ("m_ge_512", 512, None))


def _cublas(torch, dtype: str):
    """F.linear's cuBLAS(Lt) call with the bias in its epilogue, written into `out`; fp8 with
    fast accumulation (torch._scaled_mm's fastest setting; our fp8 tables may pick promoted
    or fast-accumulation tactics, see kernel.py)."""
    if dtype == "bfloat16":
        return lambda x, w, bias, out: torch.addmm(bias, x, w.T, out=out)

    def scaled(x, w, x_scale, w_scale, bias, out):
        torch._scaled_mm(
            x,
            w.T,
            scale_a=x_scale,
            scale_b=w_scale,
            bias=bias,
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
            out=out,
        )

    return scaled


def _geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def measure(
    bundles: str, tactics_max_m: int, ms, shapes_limit: int | None, extra_shapes, out_path: Path
) -> dict:
    """Rows as they are measured; the JSON is rewritten after each (a cut-off run keeps them)."""
    import torch

    from cute_aot.kernels import family
    from cute_aot.kernels.gemm_sm90 import DEFAULT_SHAPES, GemmProblem
    from cute_aot.runtime import REGISTRY, load_bundles
    from cute_aot.runtime.resolution import key_function

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
        shapes = [(n, k, True) for n, k in DEFAULT_SHAPES[:shapes_limit]]
        shapes += [(n, k, False) for n, k in extra_shapes]
        for n, k, default_shape in shapes:
            for m in ms:
                copies = operand_copies((m * k + n * k) * (2 if dtype == "bfloat16" else 1))
                sets = _operands(torch, dtype, m, n, k, copies)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                problem = GemmProblem(m, n, k, dtype, True)
                chosen = found.dispatch(problem, arch).key
                ours = key_function(chosen, arch, {})
                ours(*sets[0], out)
                ours_out = out.clone()
                baseline(*sets[0], out)
                diff = (ours_out.float() - out.float()).abs().max().item()
                # Interleaved, so a clock change (power limit) weighs on both alike.
                times = seconds_per_call_each({"ours": ours, "cublas": baseline}, sets, out)
                ours_s, cublas_s = times["ours"], times["cublas"]
                row = {
                    "family": family_name,
                    "m": m,
                    "n": n,
                    "k": k,
                    "key": chosen.describe(),
                    "default_shape": default_shape,
                    "ours_us": ours_s * 1e6,
                    "cublas_us": cublas_s * 1e6,
                    "speedup": cublas_s / ours_s,
                    "ours_tflops": 2 * m * n * k / ours_s / 1e12,
                    "cublas_tflops": 2 * m * n * k / cublas_s / 1e12,
                    "max_abs_diff_vs_cublas": diff,
                    "operand_copies": copies,
                }
                if m <= tactics_max_m:
                    row["tactics_us"] = {
                        key.describe(): seconds_per_call(key_function(key, arch, {}), sets, out)
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
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
        "summary": summarize(rows),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return report


def _in_band(m: int, low: int, high: int | None) -> bool:
    return low <= m and (high is None or m <= high)


def summarize(rows) -> dict:
    """Geomean speedup vs cuBLAS (>1: ours faster) per family and M band, the worst problem,
    and the same over the shapes not in the default (tuned) set."""
    summary = {}
    for family_name in sorted({row["family"] for row in rows}):
        mine = [row for row in rows if row["family"] == family_name]
        worst = min(mine, key=lambda r: r["speedup"])
        summary[family_name] = {
            **{
                f"geomean_speedup_{band}": _geomean(
                    r["speedup"] for r in mine if _in_band(r["m"], low, high)
                )
                for band, low, high in BANDS
            },
            "geomean_speedup_untuned_shapes": _geomean(
                r["speedup"] for r in mine if not r.get("default_shape", True)
            ),
            "problems": len(mine),
            "below_0_85": sum(r["speedup"] < 0.85 for r in mine),
            "worst": worst["speedup"],
            "worst_problem": {f: worst[f] for f in ("m", "n", "k", "key")},
            "best_tactic_speedup_geomean": _geomean(
                r["cublas_us"] / min(r["tactics_us"].values()) for r in mine if "tactics_us" in r
            ),
        }
    return summary


def compare_reports(new: dict, old: dict) -> dict:
    """Per family and band: geomean of old time / new time (>1: new faster) and of each run's
    own cuBLAS ratio, over the problems (family, m, n, k) both reports measured."""
    index = {(r["family"], r["m"], r["n"], r["k"]): r for r in old["rows"]}
    pairs = [
        (r, index[key])
        for r in new["rows"]
        if (key := (r["family"], r["m"], r["n"], r["k"])) in index
    ]
    result = {}
    for family_name in sorted({r["family"] for r, _ in pairs}):
        mine = [(a, b) for a, b in pairs if a["family"] == family_name]
        result[family_name] = {
            band: {
                "problems": len(chosen),
                "new_vs_old": _geomean(b["ours_us"] / a["ours_us"] for a, b in chosen),
                "new_vs_cublas": _geomean(a["speedup"] for a, _ in chosen),
                "old_vs_cublas": _geomean(b["speedup"] for _, b in chosen),
            }
            for band, low, high in BANDS
            if (chosen := [(a, b) for a, b in mine if _in_band(a["m"], low, high)])
        }
    return result


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
            ax.plot(
                [r["m"] for r in mine],
                [r["speedup"] for r in mine],
                marker=".",
                lw=1,
                label=f"N={n} K={k}",
            )
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
    "--tactics-max-m",
    default=0,
    show_default=True,
    help="Also time every tactic built into the bundles, for M up to this.",
)
@click.option("--m", "ms", type=int, multiple=True, help="M to measure (default 1, 2, 4 .. 8192).")
@click.option("--shapes", "shapes_limit", type=int, default=None, help="First N default shapes.")
@click.option("--shape", "extra", multiple=True, help="Another N,K (not tuned for), repeatable.")
@click.option("--out", "out_path", default="benchmarks/results/gemm_sm90_speed.json")
@click.option("--plot", "plot_from", type=click.Path(exists=True), help="Only plot this JSON.")
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(exists=True),
    help="NEW OLD: per band, geomean of old time / new time on the problems both hold.",
)
def main(bundles, tactics_max_m, ms, shapes_limit, extra, out_path, plot_from, compare):
    if plot_from:
        plot(json.loads(Path(plot_from).read_text()), Path(plot_from).with_suffix(".png"))
        return
    if compare:
        print(
            json.dumps(
                compare_reports(*(json.loads(Path(p).read_text()) for p in compare)), indent=1
            )
        )
        return
    extra_shapes = [tuple(int(v) for v in text.split(",")) for text in extra]
    report = measure(
        bundles, tactics_max_m, ms or DEFAULT_MS, shapes_limit, extra_shapes, Path(out_path)
    )
    print(json.dumps(report["summary"], indent=1))
    try:
        plot(report, Path(out_path).with_suffix(".png"))
    except ImportError:
        print("matplotlib is not installed: plot later with --plot", out_path)


if __name__ == "__main__":
    main()
