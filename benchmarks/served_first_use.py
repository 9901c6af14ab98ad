"""The first use of each served kernel, on this CPU: every call of a record is made again (its
arguments rebuilt as the build's replay makes them: tensors over no memory), in one process,
through `cute.compile` with the interceptor serving it from the bundle built from that record.
Each call is timed from its entry to its return; nothing is launched. The first call also opens
the bundle, and is reported apart.

`--passes N` serves the record N times in the one process, each pass a first use again: the
hits it remembered are forgotten (the resolution epoch moves, as when bundles change) and the
bundles' looked-up functions dropped, every argument made afresh. A process's first pass pays
once-per-target work too (source hashes, signatures); later passes show the per-kernel cost with
less noise, as `pass_medians_ms`.

    CUTE_AOT_BUNDLES=bundles CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \\
        python benchmarks/served_first_use.py RECORD --out results/first_use.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import click
from remade_calls import remade


@click.command()
@click.argument("record")
@click.option("--passes", default=1, show_default=True, help="Serve the record this many times.")
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def main(record: str, passes: int, out_path: Path | None) -> None:
    from cute_aot.kernels.recorded import read_records

    lines = [line for _, line in read_records(record) if line.get("recreatable")]
    seconds = _serve(_calls(lines))
    result = {
        "kernels": len(seconds),
        "first_ms": 1e3 * seconds[0],
        "later_median_ms": 1e3 * statistics.median(seconds[1:]),
        "later_mean_ms": 1e3 * statistics.mean(seconds[1:]),
    }
    if passes > 1:
        result["pass_medians_ms"] = [
            1e3 * statistics.median(_serve(_calls(lines), forget=True)) for _ in range(passes - 1)
        ]
    print(json.dumps(result))
    if out_path:
        out_path.write_text(json.dumps(result, indent=1) + "\n")


def _calls(lines: list[dict]) -> list[tuple]:
    """Each recorded call made again, its arguments fresh."""
    return [remade(line) for line in lines]


def _serve(calls: list[tuple], forget: bool = False) -> list[float]:
    """Seconds per call; `forget`: first forget what earlier passes resolved (see above)."""
    if forget:
        from cute_aot.runtime import epoch
        from cute_aot.runtime.registry import REGISTRY

        epoch.advance()
        for bundle in REGISTRY.bundles:
            bundle._functions.clear()  # the loader's per-bundle cache of looked-up functions
    seconds = []
    for compile_with, function, positional, keyword in calls:
        started = time.perf_counter()
        compile_with(function, *positional, **keyword)
        seconds.append(time.perf_counter() - started)
    return seconds


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
