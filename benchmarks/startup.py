"""Start-up cost of the router GEMM default set: prebuilt bundle vs JIT, fresh process per trial.

Each trial is a new Python process. The clock starts after `import torch` and CUDA context
creation (both paths pay those alike) and stops when every (M, K, N) of the default set has run
once and the GPU is synchronized.

    python benchmarks/startup.py --bundles bundles --trials 5 --jit-trials 1
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import click

CHILD_PRELUDE = """
import json, sys, time
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
from cute_aot.kernels.router_gemm import DEFAULT_SHAPES, problems
gen = torch.Generator(device="cuda").manual_seed(0)
tensors = {(k, n): (torch.randn(16, k, device="cuda", generator=gen).to(torch.bfloat16),
                    torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16))
           for k, n in DEFAULT_SHAPES}
torch.cuda.synchronize()
"""

AOT_CHILD = (
    CHILD_PRELUDE
    + """
start = time.perf_counter()
from cute_aot.runtime import load_bundles, router_gemm
load_bundles(sys.argv[1])
loaded = time.perf_counter()
calls = 0
for m, k, n in problems(DEFAULT_SHAPES):
    x, w = tensors[(k, n)]
    router_gemm(x[:m], w); calls += 1
torch.cuda.synchronize()
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "load_seconds": loaded - start, "calls": calls,
                  "cutlass_imported": "cutlass" in sys.modules}))
"""
)

JIT_CHILD = (
    CHILD_PRELUDE
    + """
start = time.perf_counter()
import cutlass.cute  # noqa: F401
imported = time.perf_counter()
from cute_aot.kernels import family_builder
from cute_aot.kernels.router_gemm import dispatch
build = family_builder("router_gemm")
arch = sys.argv[1]
compiled = {}
calls = 0
for m, k, n in problems(DEFAULT_SHAPES):
    key = dispatch(m, k, n, arch)
    if key not in compiled:
        compiled[key] = build.compile(key, arch)
    x, w = tensors[(k, n)]
    out = torch.empty(m, n, device="cuda", dtype=torch.float32)
    compiled[key](x[:m], w, out); calls += 1
torch.cuda.synchronize()
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "import_cutlass_seconds": imported - start,
                  "compile_and_call_seconds": end - imported, "keys": len(compiled), "calls": calls}))
"""
)


def _trial(code: str, arg: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True)
    if result.returncode != 0:
        raise click.ClickException(f"trial failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option("--arch", default="sm_90a", show_default=True)
@click.option("--trials", default=5, show_default=True, help="Fresh processes for the bundle path.")
@click.option(
    "--jit-trials", default=1, show_default=True, help="Fresh processes for JIT (0: skip)."
)
@click.option("--out", "out_path", default="benchmarks/results/startup.json", show_default=True)
def main(bundles, arch, trials, jit_trials, out_path):
    aot = [_trial(textwrap.dedent(AOT_CHILD), bundles) for _ in range(trials)]
    jit = [_trial(textwrap.dedent(JIT_CHILD), arch) for _ in range(jit_trials)]
    report = {
        "arch": arch,
        "bundle": {"median_seconds": statistics.median(t["seconds"] for t in aot), "trials": aot},
    }
    if jit:
        report["jit"] = {
            "median_seconds": statistics.median(t["seconds"] for t in jit),
            "trials": jit,
        }
        report["jit_over_bundle"] = (
            report["jit"]["median_seconds"] / report["bundle"]["median_seconds"]
        )
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))
    line = f"bundle: {report['bundle']['median_seconds'] * 1e3:.1f} ms (median of {trials})"
    if jit:
        line += (
            f" | JIT: {report['jit']['median_seconds']:.2f} s "
            f"(import cutlass {jit[0]['import_cutlass_seconds']:.2f} s, {jit[0]['keys']} keys)"
            f" | JIT/bundle = {report['jit_over_bundle']:.0f}x"
        )
    print(line)


if __name__ == "__main__":
    main()
