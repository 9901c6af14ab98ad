"""What a served `cute.compile` costs on a hit: cute-aot's own work per call, on this CPU.

A plain program's compile of the user kernel (tests/user_kernels/scale.py: 5 arguments, fake
tensors, TVM-FFI) is served from a bundle built from its record; each call gets fresh argument
objects, and the whole `cute.compile` is timed, from its entry to its return (the bundle's
function is not called: that is the kernel's time, not ours). Activation is the environment's
alone (the startup hook); the benchmark imports nothing of cute-aot.

    aot-build --from-record calls.jsonl --arch sm90a --out bundles    # once
    CUTE_AOT_BUNDLES=bundles CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \\
        python benchmarks/hit_cost.py --out results/hit_cost_cpu.json
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import click


@click.command()
@click.option("--calls", default=2000, show_default=True)
@click.option("--block", default=128, show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def main(calls: int, block: int, out_path: Path | None) -> None:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from tests.user_kernels.scale import scale

    options = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(True)]
    seconds = []
    for _ in range(calls):
        n = cute.sym_int()
        x, y = (make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16) for _ in "xy")
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        started = time.perf_counter()
        served = options(scale, x, y, 2.0, stream, block=block)
        seconds.append(time.perf_counter() - started)
    if type(served).__name__ != "function":
        raise SystemExit(f"not served from a bundle: cute.compile returned {type(served)}")
    steady = seconds[len(seconds) // 10 :]  # the first calls resolve and warm caches
    result = {
        "calls": calls,
        "first_call_ms": 1e3 * seconds[0],
        "median_ms": 1e3 * statistics.median(steady),
        "p90_ms": 1e3 * sorted(steady)[int(0.9 * len(steady))],
        "python": sys.version.split()[0],
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(result))
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
