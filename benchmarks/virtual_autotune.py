"""FlashInfer's autotuner on a virtual GPU: every candidate compiles (and is recorded), none is
picked by a timing, and no tuning file is written outside the process's own folder.

    CUTE_AOT_VIRTUAL=b200 CUTE_AOT_RECORD=out/records/ CUTE_AOT_REPORT=out/report.json \\
        python benchmarks/virtual_autotune.py --out out/autotune.json

A workload script of public API calls: `mm_bf16(backend="tgv")` at one shape inside
`flashinfer.autotuner.autotune(True)`. A virtual GPU has no timing to give
(`Event.elapsed_time` raises Unanswerable), so the autotuner skips every tactic it profiles and
falls back to its default. Writes what the tuner saw: the tactics it tried and failed, the
compiles made (from the virtual summary), and the files written under the home and cache folders
the process started with (none may appear: the libraries' caches live in the process's folder).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click


def _files_under(folders: list[Path]) -> set[str]:
    return {str(p) for folder in folders if folder.is_dir() for p in folder.rglob("*")}


@click.command()
@click.option("--m", default=8, show_default=True)
@click.option("--n", default=7168, show_default=True)
@click.option("--k", default=2048, show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True)
def main(m: int, n: int, k: int, out_path: Path) -> None:
    watched = [Path.home() / ".cache", Path.home() / ".flashinfer"]
    before = _files_under(watched)
    started = time.perf_counter()
    import flashinfer
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    error = None
    with autotune(True):
        try:
            flashinfer.mm_bf16(a, b, backend="tgv")
        except Exception as exc:  # said in the result: the tuner let something through
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
    stats = AutoTuner.get().stats
    from cute_aot.runtime.capture import virtual

    found = virtual.summary()
    result = {
        "problem": {"m": m, "n": n, "k": k, "dtype": "bfloat16", "backend": "tgv"},
        "profile": found["profile"]["profile"] if found["profile"] else None,
        "seconds": time.perf_counter() - started,
        "error": error,
        "compile_calls": found["compile_calls"],
        "kernels": found["kernels"],
        "failed_tactics": {op: len(tactics) for op, tactics in stats.failed_tactics.items()},
        "unanswerable": found["unanswerable"],
        "new_files_in_home_caches": sorted(_files_under(watched) - before),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "flashinfer": flashinfer.__version__,
        "cute_aot_virtual": os.environ.get("CUTE_AOT_VIRTUAL"),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({key: result[key] for key in ("compile_calls", "kernels", "error")}))


if __name__ == "__main__":
    main()
