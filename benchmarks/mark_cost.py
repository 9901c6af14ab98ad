"""What the `cute.compile` hook adds to marking a tensor, on this CPU: callers mark their tensors
(`mark_layout_dynamic`, `mark_compact_shape_dynamic`) before every compile, served or not, and
the hook logs each mark for records. Timed in one process: `from_dlpack` of a torch tensor and
one mark, first without the hook, then with it installed; best of --repeat rounds of --calls.

    python benchmarks/mark_cost.py --out results/mark_cost_cpu.json
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import click
from result_file import emit


def _best_us(work, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(calls):
            work()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


@click.command()
@click.option("--calls", default=5000, show_default=True)
@click.option("--repeat", default=5, show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def main(calls: int, repeat: int, out_path: Path | None) -> None:
    import torch
    from cutlass.cute.runtime import from_dlpack

    from cute_aot.runtime import compile_hook

    source = torch.zeros(64, 128)

    def layout():
        from_dlpack(source).mark_layout_dynamic()

    def compact():
        from_dlpack(source).mark_compact_shape_dynamic(0, divisibility=8)

    result = {"machine": platform.processor() or platform.machine(), "calls": calls}
    for name, work in (("layout", layout), ("compact", compact)):
        result[f"{name}_plain_us"] = _best_us(work, calls, repeat)
    compile_hook.install_hook()
    for name, work in (("layout", layout), ("compact", compact)):
        result[f"{name}_hooked_us"] = _best_us(work, calls, repeat)
        result[f"{name}_added_us"] = result[f"{name}_hooked_us"] - result[f"{name}_plain_us"]
    emit(result, out_path)


if __name__ == "__main__":
    main()
