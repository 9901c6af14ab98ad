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


def _kernel_class(record: dict) -> str:
    """`FlashAttentionForwardSm90` of `...flash_fwd_sm90:FlashAttentionForwardSm90.__call__`."""
    return str(record.get("target")).split(":")[-1].removesuffix(".__call__")


if __name__ == "__main__":
    main()
