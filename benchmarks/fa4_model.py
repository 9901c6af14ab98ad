"""FlashAttention-4 at a model's shapes (the workload is cute_aot.aot.workloads.fa4, which
`aot-build record --workload fa4` runs): run it, and tabulate what was recorded and built.

    CUTE_AOT_VIRTUAL=h200 CUTE_AOT_RECORD=rec/llama/ python benchmarks/fa4_model.py run \
        --model llama-3.1-8b --out runs.jsonl
    aot-build --from-record rec/llama/ --arch sm90a --name fa4-llama --out bundles/
    python benchmarks/fa4_model.py table --runs runs.jsonl --records rec/ --bundles bundles/ \
        --out coverage.json

The configurations and models are the workload module's (its docstring says what each runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from cute_aot.aot.workloads import fa4 as fa4_workload


@click.group()
def main():
    """Run a model's FA4 workload, or tabulate what was recorded and built."""


main.add_command(fa4_workload.main, "run")


@main.command()
@click.option("--runs", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option(
    "--records",
    type=click.Path(file_okay=False, exists=True),
    required=True,
    help="A folder of per-model record folders, named as the models.",
)
@click.option(
    "--bundles",
    type=click.Path(file_okay=False),
    multiple=True,
    help="Folders of bundles built from them (repeatable: one per architecture).",
)
@click.option("--out", type=click.Path(dir_okay=False), required=True)
def table(runs, records, bundles, out):
    """Per model and architecture: configurations run, kernels recorded, kernels built."""
    from cute_aot.artifacts.bundle import read_manifest
    from cute_aot.kernels.recorded import read_records

    built: dict[str, set] = {}
    for folder in bundles:
        for path in sorted(Path(folder).glob("*.cuteaot")):
            manifest = read_manifest(path)
            built.setdefault(manifest.arch, set()).update(e.key_id for e in manifest.entries)
    rows = [json.loads(line) for line in Path(runs).read_text().splitlines()]
    coverage = []
    for name in sorted({row["model"] for row in rows}):
        mine = [row for row in rows if row["model"] == name]
        folder = Path(records) / name
        recorded = [r for _, r in read_records(str(folder))] if folder.exists() else []
        kernels = {r["key_id"]: r for r in recorded if r.get("recreatable") is True}
        refused = [r for r in recorded if r.get("recreatable") is False]
        arch = next((r["arch"] for r in kernels.values()), None)
        coverage.append(
            {
                "model": name,
                "gpu": mine[0]["gpu"],
                "arch": arch,
                "configs_run": [row["config"] for row in mine if row["ok"]],
                "configs_refused": {row["config"]: row["error"] for row in mine if not row["ok"]},
                "calls_recorded": len(recorded),
                "calls_not_recordable": len(refused),
                "kernels_recorded": len(kernels),
                "kernels_built": len(built.get(arch, set()) & kernels.keys()),  # for its own arch
                "targets": sorted({_kernel_class(r) for r in kernels.values()}),
            }
        )
        click.echo(
            f"{name} ({mine[0]['gpu']}): {len(coverage[-1]['configs_run'])} configs, "
            f"{len(kernels)} kernels, built {coverage[-1]['kernels_built']}"
        )
    Path(out).write_text(json.dumps({"models": coverage}, indent=1) + "\n")


# Readiness goals (issue 53): a served first call against FA4's JIT, and against FA4's warm disk
# cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1, filled by an earlier process).
GOALS = {"jit": 1000.0, "fa4_cache": 3.0}


@main.command()
@click.option(
    "--run",
    "labelled",
    multiple=True,
    required=True,
    metavar="LABEL=RUNS.jsonl",
    help="Rows of one way of running the workload (repeatable): jit=, fa4_cache= (the warm "
    "run), served= (cute-aot in mode aot).",
)
@click.option("--against", default="served", show_default=True, help="The label compared.")
@click.option("--out", type=click.Path(dir_okay=False), required=True)
def readiness(labelled, against, out):
    """First call of each configuration, per way of running it: each baseline's time over
    `--against`'s, per configuration, per model (its set's sum) and for everything."""
    firsts: dict[str, dict[tuple[str, str], float]] = {}
    steadies: dict[str, dict[tuple[str, str], float]] = {}
    for item in labelled:
        label, _, path = item.partition("=")
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        firsts[label] = {(r["model"], r["config"]): r["first_call_s"] for r in rows if r["ok"]}
        steadies[label] = {
            (r["model"], r["config"]): r["steady_call_us"] for r in rows if r.get("steady_call_us")
        }
    if against not in firsts:
        raise click.UsageError(f"no --run {against}=...")
    served = firsts[against]
    baselines = [label for label in firsts if label != against]
    configs = []
    for model, config in sorted(served):
        row = {"model": model, "config": config, against: served[model, config]}
        for label in baselines:
            seconds = firsts[label].get((model, config))
            row[label] = seconds
            row[f"{label}_over_{against}"] = _ratio(seconds, served[model, config])
        configs.append(row)
    sets = {}
    for model in sorted({model for model, _ in served}):
        mine = [row for row in configs if row["model"] == model]
        sets[model] = {
            label: round(sum(row[label] or 0.0 for row in mine), 4)
            for label in (against, *baselines)
        }
    total = {
        label: round(sum(s[label] for s in sets.values()), 4) for label in (against, *baselines)
    }
    goals = {
        label: {
            "goal": goal,
            "median_ratio": _median(
                [
                    row[f"{label}_over_{against}"]
                    for row in configs
                    if row.get(f"{label}_over_{against}")
                ]
            ),
            "set_ratio": _ratio(total.get(label), total[against]),
        }
        for label, goal in GOALS.items()
        if label in baselines
    }
    for label, found in goals.items():
        click.echo(
            f"{label} / {against}: median per configuration {found['median_ratio']}x, whole set "
            f"{found['set_ratio']}x (goal {found['goal']}x)"
        )
    # a configuration a baseline ran that the compared way did not: never left out silently
    not_served = sorted(
        f"{model} {config}"
        for label in baselines
        for model, config in firsts[label].keys() - served.keys()
    )
    if not_served:
        click.echo(f"not run by {against}: {', '.join(sorted(set(not_served)))}")
    # steady calls (--steady): the served call's time over FA4's own cached call (goal <= 1.02)
    steady = {}
    for label in baselines:
        pairs = [
            (row["model"], row["config"], steadies[label].get(k), steadies[against].get(k))
            for row in configs
            if (k := (row["model"], row["config"])) in steadies[label] and k in steadies[against]
        ]
        if pairs:
            steady[label] = {
                f"{model} {config}": {label: base, against: ours, "ratio": round(ours / base, 3)}
                for model, config, base, ours in pairs
            }
            worst = max(entry["ratio"] for entry in steady[label].values())
            click.echo(f"steady call, {against} / {label}: worst {worst}x (goal <= 1.02x)")
    document = {
        "steady_call": steady,
        "configs": configs,
        "sets": sets,
        "total_s": total,
        "goals": goals,
        f"not_run_by_{against}": sorted(set(not_served)),
    }
    Path(out).write_text(json.dumps(document, indent=1) + "\n")


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 1)


def _median(values: list[float]) -> float | None:
    import statistics

    return round(statistics.median(values), 1) if values else None


def _kernel_class(record: dict) -> str:
    """`FlashAttentionForwardSm90` of `...flash_fwd_sm90:FlashAttentionForwardSm90.__call__`."""
    return str(record.get("target")).split(":")[-1].removesuffix(".__call__")


if __name__ == "__main__":
    main()
