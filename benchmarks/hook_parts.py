"""Where a served `cute.compile`'s time goes: a program (a benchmark) run with timers around the
compile hook's steps, each step's calls timed from entry to return; medians per step, written as
JSON. The timers add about a microsecond per step to what they time, and are for comparing two
runs of the same program (say, FlashInfer's own calls against the record's calls replayed).

    CUTE_AOT_BUNDLES=bundles CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \\
        python benchmarks/hook_parts.py --out parts.json -- \\
        benchmarks/recorded_flashinfer.py run --phase aot --out aot.json
"""

from __future__ import annotations

import collections
import inspect
import json
import runpy
import statistics
import sys
import time
from pathlib import Path

import click

# (module, attribute, step): the hook's steps, looked up as globals at each call
STEPS = (
    ("cute_aot.runtime.compile_hook", "describe_call", "describe"),
    ("cute_aot.runtime.compile_hook", "_served", "served (all of the lookup)"),
    ("cute_aot.runtime.compile_hook", "_arch", "served: architecture"),
    ("cute_aot.runtime.compile_hook", "_kernel_for_this_gpu", "served: entry key"),
    ("cute_aot.runtime.compile_hook", "_callable_as_compiled", "served: kwargs wrapper"),
)
METHODS = (
    ("cute_aot.runtime.serving", "Serving", "function", "served: policy and bundle function"),
    ("cute_aot.kernels.recorded.calls", "_Describer", "dlpack_facts", "describe: a DLPack tensor"),
)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True)
@click.argument("program", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(out_path: Path, program: str, args: tuple[str, ...]) -> None:
    import importlib

    seconds: dict[str, list[float]] = collections.defaultdict(list)
    for module, name, step in STEPS:
        owner = importlib.import_module(module)
        setattr(owner, name, _timed(getattr(owner, name), seconds[step]))
    for module, cls, name, step in METHODS:
        owner = getattr(importlib.import_module(module), cls)
        wrapped = _timed(getattr(owner, name), seconds[step])
        if isinstance(inspect.getattr_static(owner, name), staticmethod):
            wrapped = staticmethod(wrapped)
        setattr(owner, name, wrapped)
    sys.argv = [program, *args]
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    result = {
        step: {"calls": len(each), "median_us": 1e6 * statistics.median(each[1:] or each)}
        for step, each in seconds.items()
        if each
    }
    print(json.dumps(result, indent=1))
    out_path.write_text(json.dumps({"program": [program, *args], "steps": result}, indent=1))


def _timed(function, into: list[float]):
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - started)

    return timed


if __name__ == "__main__":
    main()
