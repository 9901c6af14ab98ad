"""Longer fuzz run of the bundle readers (the same targets as tests/test_fuzz_bundle.py).

Random (not derandomized) examples, as many per target as asked. Any exception outside cute-aot's
error hierarchy stops the run; Hypothesis shrinks it to a minimal example and the script exits 1
with it. Writes JSON (and a PNG when matplotlib is present) of how the examples ended.

    python benchmarks/fuzz_bundle.py --examples 20000 --out benchmarks/results/fuzz_bundle.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import click
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `tests` imports

from tests.test_fuzz_bundle import (  # noqa: E402
    byte_edits,
    fuzz_bytes,
    fuzz_library,
    fuzz_manifest,
    make_base,
    manifest_edits,
)

TARGETS = ("bytes", "manifest", "library")


def _runner(base, target: str, examples: int):
    run_settings = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    if target == "bytes":
        strategy, call = byte_edits(len(base.data)), lambda edits: fuzz_bytes(base, edits)
    elif target == "manifest":
        strategy, call = manifest_edits(base.manifest), lambda data: fuzz_manifest(base, data)
    else:
        strategy, call = byte_edits(len(base.library)), lambda edits: fuzz_library(base, edits)
    return run_settings(given(strategy)(call))


@click.command()
@click.option("--examples", default=20_000, show_default=True, help="Examples per target.")
@click.option(
    "--target", "targets", multiple=True, type=click.Choice(TARGETS), help="Default: all."
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("benchmarks/results/fuzz_bundle.json"),
    show_default=True,
)
def main(examples: int, targets: tuple[str, ...], out: Path) -> None:
    results = {"examples_per_target": examples, "targets": {}}
    failed = False
    with tempfile.TemporaryDirectory(prefix="cute-aot-fuzz-") as folder:
        base = make_base(Path(folder))
        for target in targets or TARGETS:
            started = time.perf_counter()
            error = None
            try:
                _runner(base, target, examples)()
            except Exception:  # noqa: BLE001  (an escape from the hierarchy: the finding itself)
                error = traceback.format_exc()
                failed = True
            counts = {
                kind: n for (name, kind), n in sorted(base.outcomes.items()) if name == target
            }
            results["targets"][target] = {
                "reads": sum(counts.values()),
                "outcomes": counts,
                "seconds": round(time.perf_counter() - started, 2),
                "escaped": error,
            }
            click.echo(
                f"{target}: {sum(counts.values())} reads {counts}" + (" ESCAPED" if error else "")
            )
            if error:
                click.echo(error, err=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    click.echo(f"wrote {out}")
    try:
        _plot(results, out.with_suffix(".png"))
    except ImportError:
        pass
    sys.exit(1 if failed else 0)


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(results["targets"])
    kinds = sorted({kind for t in targets for kind in results["targets"][t]["outcomes"]})
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0] * len(targets)
    for kind in kinds:
        heights = [results["targets"][t]["outcomes"].get(kind, 0) for t in targets]
        ax.bar(targets, heights, bottom=bottom, label=kind)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("reads")
    ax.set_title(f"bundle fuzz: {results['examples_per_target']} examples per target")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
