"""Server readiness for FlashInfer's GDN decode keys: cute-aot bundle vs FlashInfer's JIT vs
FlashInfer's own disk cache, fresh process per trial, same run.

A trial is a new Python process that imports torch and creates the CUDA context (all paths pay
those alike; not timed), then times `import flashinfer` and, separately, the time until every
default flashinfer_gdn_decode key has run once through FlashInfer's public
`gated_delta_rule_decode` and the GPU is synchronized:

    jit     FLASHINFER_WORKSPACE_BASE empty: FlashInfer compiles every kernel
    disk    the same folder afterwards: FlashInfer reloads its cached .o files
    bundle  FLASHINFER_DISABLE_JIT=1: load_bundles + cute_aot.runtime.flashinfer.install()

    python benchmarks/flashinfer_gdn_startup.py --bundles bundles --out results.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import click

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    from cute_aot.kernels.flashinfer.gdn_decode import family
    from cute_aot.kernels.flashinfer.gdn_reference import example_inputs
    first_problem = {}
    for shape in family.default_shapes:
        for problem in family.problems(shape):
            first_problem.setdefault(family.dispatch(problem, "sm_90a").key, problem)
    work = [example_inputs(problem, "cuda", seed=i)
            for i, problem in enumerate(first_problem.values())]
    torch.cuda.synchronize()
    start = time.perf_counter()
    from flashinfer.gdn_decode import gated_delta_rule_decode
    imported = time.perf_counter()
    if sys.argv[1] == "bundle":
        from cute_aot.runtime import flashinfer as serve_flashinfer, load_bundles
        load_bundles(sys.argv[2])
        assert serve_flashinfer.install()["flashinfer_gdn_decode"] == "installed"
    for inputs in work:
        gated_delta_rule_decode(**inputs)
    torch.cuda.synchronize()
    end = time.perf_counter()
    print(json.dumps({"import_seconds": imported - start, "ready_seconds": end - imported,
                      "keys": len(work)}))
    """
)


def trial(mode: str, bundles: str, workspace: str) -> dict:
    env = dict(os.environ, FLASHINFER_WORKSPACE_BASE=workspace)
    if mode == "bundle":
        env.update(FLASHINFER_DISABLE_JIT="1", CUTE_AOT_MODE="aot")
    run = subprocess.run(
        [sys.executable, "-c", CHILD, mode, bundles],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if run.returncode:
        raise click.ClickException(f"{mode} trial failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def summary(trials: list[dict]) -> dict:
    return {
        "trials": trials,
        "median_import_seconds": statistics.median(t["import_seconds"] for t in trials),
        "median_ready_seconds": statistics.median(t["ready_seconds"] for t in trials),
    }


@click.command()
@click.option("--bundles", required=True, help="Folder or file with the GDN bundle (sm_90a).")
@click.option("--trials", default=3, show_default=True, help="Trials of disk and bundle.")
@click.option("--out", type=click.Path(path_type=Path), required=True)
def main(bundles: str, trials: int, out: Path) -> None:
    import torch

    with tempfile.TemporaryDirectory(prefix="flashinfer-ws-") as workspace:
        jit = [trial("jit", bundles, workspace)]  # fills the disk cache the disk trials read
        disk = [trial("disk", bundles, workspace) for _ in range(trials)]
    with tempfile.TemporaryDirectory(prefix="flashinfer-ws-") as empty:
        bundle = [trial("bundle", bundles, empty) for _ in range(trials)]
    results = {
        "benchmark": "flashinfer_gdn_decode readiness: every default key's first call",
        "gpu": torch.cuda.get_device_name(),
        "keys": bundle[0]["keys"],
        "jit": summary(jit),
        "disk_cache": summary(disk),
        "bundle": summary(bundle),
    }
    ready = {
        mode: results[mode]["median_ready_seconds"] for mode in ("jit", "disk_cache", "bundle")
    }
    results["speedup_vs_jit"] = ready["jit"] / ready["bundle"]
    results["speedup_vs_disk_cache"] = ready["disk_cache"] / ready["bundle"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    for mode, seconds in ready.items():
        click.echo(f"{mode:>10}: ready {seconds * 1e3:9.1f} ms after import")
    click.echo(
        f"bundle vs JIT {results['speedup_vs_jit']:.0f}x, vs disk cache "
        f"{results['speedup_vs_disk_cache']:.1f}x -> {out}"
    )


if __name__ == "__main__":
    main()
