"""Opening one bundle in fresh processes, on this machine: the time `load_bundles` takes for a
bundle whose library was extracted and verified before (a server's restart), tvm-ffi's import
and cute-aot's own import timed apart, not counted. Median over trials 2..N (the first extracts
and verifies the library into the private cache).

    python benchmarks/bundle_open.py /tmp/rec600/variants600-sm_90a.cuteaot --trials 7 \\
        --out benchmarks/results/bundle_open_recorded_600_cpu.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

CHILD = """
import json, sys, time
import tvm_ffi  # not counted: servers have it (and torch) imported already
started = time.perf_counter()
from cute_aot.runtime.registry import load_bundles
imported = time.perf_counter()
bundles = load_bundles(sys.argv[1], gpu_arch=sys.argv[2])
opened = time.perf_counter()
print(json.dumps({
    "import_ms": 1e3 * (imported - started),
    "open_ms": 1e3 * (opened - imported),
    "kernels": sum(len(bundle.entries) for bundle in bundles),
}))
"""


@click.command()
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--trials", default=7, show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def main(bundle: Path, trials: int, out_path: Path | None) -> None:
    from cute_aot.artifacts.bundle import read_manifest

    manifest = read_manifest(bundle)
    runs = []
    for _ in range(trials):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(bundle), manifest.arch],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "CUTE_AOT_BUNDLES": ""},
        )
        runs.append(json.loads(done.stdout))
        if not runs[-1]["kernels"]:  # refused (stale, another GPU...): not an open to time
            raise click.ClickException(f"{bundle}: not loaded: {done.stderr.strip()[-500:]}")
    later = runs[1:] or runs
    result = {
        "bundle": bundle.name,
        "kernels": runs[0]["kernels"],
        "bundle_bytes": bundle.stat().st_size,
        "manifest_entries_bytes": len(json.dumps([e.key for e in manifest.entries])),
        "open_ms_median": statistics.median(run["open_ms"] for run in later),
        "import_ms_median": statistics.median(run["import_ms"] for run in later),
        "trials": runs,
    }
    click.echo(json.dumps({k: v for k, v in result.items() if k != "trials"}))
    if out_path:
        out_path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
