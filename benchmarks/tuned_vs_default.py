"""Tuned dispatch tables vs the packages' own, measured in the same run on this GPU.

For every problem aot-tune measured (its table's shapes), both tables dispatch; where they pick
different keys, both kernels are timed (kernels/timing: CUDA graphs, operands out of L2) in
alternation, ROUNDS times each. Noise is judged from the data itself: the spread between repeated
measurements of one kernel (max/min - 1 over its rounds); the tuned kernel counts as slower only
when its median exceeds the default's by more than the noise of that pair.

    python benchmarks/tuned_vs_default.py --bundles bundles --tables tables.json \
        --out benchmarks/results/tuned_vs_default.json
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import click

from cute_aot.aot.tools.aot_tune.timing import seconds_per_call

ROUNDS = 3


def _geomean(values):
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def compare(bundles: str, tables_path: str, only: tuple[str, ...] = ()) -> dict:
    import torch

    from cute_aot.aot.tools.aot_tune.cli import operand_sets
    from cute_aot.kernels import family
    from cute_aot.kernels.tables import read_tables
    from cute_aot.runtime import load_bundles
    from cute_aot.runtime.resolution import key_function

    load_bundles(bundles)
    report = {"gpu": torch.cuda.get_device_name(), "rounds": ROUNDS, "families": {}}
    for tuned in read_tables(tables_path):
        if only and tuned.family not in only:
            continue
        found, arch = family(tuned.family), tuned.arch
        default = found.default_table(arch)
        rows = []
        # Read back through the family's own shape rule: a router table tuned before the N,K
        # order holds K,N pairs, which it refuses instead of timing the wrong problems.
        measured = [found.parse_shape(",".join(map(str, s))) for s in tuned.provenance["shapes"]]
        for shape in measured:
            for problem in found.tune_problems(shape):
                keys = [found.dispatch(problem, arch, t).key for t in (default, tuned)]
                row = {
                    "problem": list(problem),
                    "shape": list(shape),
                    "default_key": keys[0].describe(),
                    "tuned_key": keys[1].describe(),
                }
                if keys[0] == keys[1]:
                    rows.append({**row, "same_key": True, "speedup": 1.0})
                    continue
                sets, out = operand_sets(found, problem)
                calls = [found.bind(key_function(key, arch, {}), problem) for key in keys]
                times = [[], []]
                for _ in range(ROUNDS):
                    for side in (0, 1):
                        times[side].append(seconds_per_call(calls[side], sets, out) * 1e6)
                medians = [statistics.median(t) for t in times]
                noise = max(max(t) / min(t) - 1 for t in times)
                speedup = medians[0] / medians[1]
                rows.append(
                    {
                        **row,
                        "same_key": False,
                        "default_us": times[0],
                        "tuned_us": times[1],
                        "speedup": speedup,
                        "noise": noise,
                        "slower_beyond_noise": speedup < 1 / (1 + noise),
                    }
                )
                del sets, out
                torch.cuda.empty_cache()
                print(f"{found.name} {problem} x{speedup:.3f} (noise {noise:.3f})", flush=True)
        per_shape = {}
        for shape in {tuple(r["shape"]) for r in rows}:
            mine = [r["speedup"] for r in rows if tuple(r["shape"]) == shape]
            per_shape[",".join(map(str, shape))] = {"geomean": _geomean(mine), "worst": min(mine)}
        measured = [r for r in rows if not r["same_key"]]
        report["families"][found.name] = {
            "tuned_table": tuned.digest,
            "default_table": default.digest,
            "problems": len(rows),
            "problems_with_other_keys": len(measured),
            "geomean_speedup": _geomean(r["speedup"] for r in rows),
            "geomean_speedup_where_keys_differ": _geomean(r["speedup"] for r in measured),
            "worst": min((r["speedup"] for r in rows), default=None),
            "slower_beyond_noise": [r for r in measured if r["slower_beyond_noise"]],
            "median_noise": statistics.median([r["noise"] for r in measured]) if measured else None,
            "per_shape": per_shape,
            "rows": rows,
        }
    return report


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option("--tables", "tables_path", required=True, type=click.Path(exists=True))
@click.option("--family", "only", multiple=True, help="Only these families (default: every table).")
@click.option("--out", "out_path", default="benchmarks/results/tuned_vs_default.json")
def main(bundles, tables_path, only, out_path):
    report = compare(bundles, tables_path, only)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=1))
    for name, found in report["families"].items():
        print(
            f"{name}: {found['problems_with_other_keys']} of {found['problems']} problems get "
            f"another key; geomean x{found['geomean_speedup']:.3f} (where they differ "
            f"x{found['geomean_speedup_where_keys_differ'] or 1:.3f}), "
            f"worst x{found['worst']:.3f}, "
            f"{len(found['slower_beyond_noise'])} slower beyond noise"
        )


if __name__ == "__main__":
    main()
