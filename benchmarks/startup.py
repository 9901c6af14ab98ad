"""Start-up cost of a family's default keys: prebuilt bundle vs JIT, fresh process per trial.

Each trial is a new Python process. The clock starts after `import torch` and CUDA context
creation (both paths pay those alike) and stops when every default key of the family has run
once (on the first default problem that dispatches to it) and the GPU is synchronized.

    python benchmarks/startup.py --bundles bundles --family router_gemm --family gemm_sm90
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
from cute_aot.kernels import family
found = family(sys.argv[2])
major, minor = torch.cuda.get_device_capability()
arch = f"sm_{major}{minor}a"
# Each default key once, on the first default problem that dispatches to it.
first_problem = {}
for shape in found.default_shapes:
    for problem in found.problems(shape):
        first_problem.setdefault(found.dispatch(problem, arch).key, problem)
def tensor(arg, shape):
    dtype = getattr(torch, arg.dtype)
    return None if shape is None else torch.randn(shape, device="cuda").to(dtype)
work = [(key, problem, [tensor(a, s) for a, s in zip(found.inputs, found.input_shapes(problem))])
        for key, problem in first_problem.items()]
torch.cuda.synchronize()
"""

AOT_CHILD = (
    CHILD_PRELUDE
    + """
start = time.perf_counter()
from cute_aot.runtime import load_bundles, op
load_bundles(sys.argv[1])
loaded = time.perf_counter()
call = op(found.name)
for key, problem, inputs in work:
    call(*inputs)
torch.cuda.synchronize()
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "load_seconds": loaded - start, "keys": len(work),
                  "cutlass_imported": "cutlass" in sys.modules}))
"""
)

JIT_CHILD = (
    CHILD_PRELUDE
    + """
start = time.perf_counter()
import cutlass.cute  # noqa: F401
imported = time.perf_counter()
for key, problem, inputs in work:
    out = torch.empty(found.output_shape(problem), device="cuda",
                      dtype=getattr(torch, found.output.dtype))
    found.bind(found.compile(key, arch), problem)(*inputs, out)
torch.cuda.synchronize()
end = time.perf_counter()
print(json.dumps({"seconds": end - start, "import_cutlass_seconds": imported - start,
                  "compile_and_call_seconds": end - imported, "keys": len(work)}))
"""
)


def _trial(code: str, bundles: str, family_name: str) -> dict:
    command = [sys.executable, "-c", code, bundles, family_name]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise click.ClickException(f"trial failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option(
    "--family",
    "family_names",
    multiple=True,
    default=["router_gemm"],
    show_default=True,
    help="Kernel family, repeatable: each is measured on its own.",
)
@click.option("--trials", default=5, show_default=True, help="Fresh processes for the bundle path.")
@click.option(
    "--jit-trials", default=1, show_default=True, help="Fresh processes for JIT (0: skip)."
)
@click.option("--out", "out_path", default="benchmarks/results/startup.json", show_default=True)
def main(bundles, family_names, trials, jit_trials, out_path):
    report = {}
    for name in family_names:
        aot = [_trial(textwrap.dedent(AOT_CHILD), bundles, name) for _ in range(trials)]
        jit = [_trial(textwrap.dedent(JIT_CHILD), bundles, name) for _ in range(jit_trials)]
        row = report[name] = {
            "keys": aot[0]["keys"],
            "bundle": {
                "median_seconds": statistics.median(t["seconds"] for t in aot),
                "trials": aot,
            },
        }
        line = f"{name}: {row['keys']} keys; bundle {row['bundle']['median_seconds'] * 1e3:.1f} ms"
        if jit:
            row["jit"] = {
                "median_seconds": statistics.median(t["seconds"] for t in jit),
                "trials": jit,
            }
            row["jit_over_bundle"] = row["jit"]["median_seconds"] / row["bundle"]["median_seconds"]
            line += (
                f" (median of {trials}) | JIT {row['jit']['median_seconds']:.2f} s (import "
                f"cutlass {jit[0]['import_cutlass_seconds']:.2f} s) | JIT/bundle = "
                f"{row['jit_over_bundle']:.0f}x"
            )
        print(line, flush=True)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
