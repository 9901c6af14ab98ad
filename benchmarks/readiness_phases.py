"""Where a fresh process's readiness goes: the phases of loading a bundle and running every
default router key once, timed in fresh processes (after `import torch` and CUDA start).

    python benchmarks/readiness_phases.py --bundles bundles --trials 7
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap

import click
from startup import CHILD_PRELUDE

# The same default problems and inputs as benchmarks/startup.py (`work`: [(key, problem, inputs)]).
CHILD = textwrap.dedent(CHILD_PRELUDE) + textwrap.dedent(r"""
t = [time.perf_counter()]
import cute_aot.runtime.registry
t.append(time.perf_counter())
import tvm_ffi
t.append(time.perf_counter())
from cute_aot.runtime import load_bundles, op
load_bundles(sys.argv[1])
t.append(time.perf_counter())
call = op("router_gemm")
call(*work[0][2]); torch.cuda.synchronize()
t.append(time.perf_counter())
for _, _, inputs in work[1:]:
    call(*inputs)
torch.cuda.synchronize()
t.append(time.perf_counter())
names = ["import_registry", "import_tvm_ffi", "load_bundles", "first_call", "other_first_calls"]
phases = {name: (b - a) * 1e3 for name, a, b in zip(names, t, t[1:])}
print(json.dumps({**phases, "total": (t[-1] - t[0]) * 1e3, "keys": len(work)}))
""")


@click.command()
@click.option("--bundles", default="bundles", show_default=True)
@click.option("--trials", default=7, show_default=True)
def main(bundles, trials):
    rows = []
    for _ in range(trials):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, bundles, "router_gemm"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise click.ClickException(done.stderr[-3000:])
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {name: round(statistics.median(r[name] for r in rows), 1) for name in rows[0]}
    print(json.dumps({"median_ms": medians, "trials": rows}, indent=1))


if __name__ == "__main__":
    main()
