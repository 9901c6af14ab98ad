"""What the installed startup hook costs every Python process: interpreter start time in a fresh
venv without cute-aot, and in one with the cute-aot wheel installed (its cute-aot-startup.pth in
site-packages), with no variable set, with an unrelated CUTE_AOT_* one, and with activation asked
for (CUTE_AOT_REPORT: the hook is armed, cutlass is not imported). Runs alternate between the
venvs, so that a busy machine slows each alike; medians over --runs starts each.

    python benchmarks/interpreter_start.py --out benchmarks/results/interpreter_start_cpu.json
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

import click
from result_file import emit

REPO = Path(__file__).resolve().parents[1]


def _venv(root: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(root)
    return root / "bin" / "python"


@click.command()
@click.option("--runs", default=300, show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path))
def main(runs: int, out_path: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(tmp),
                str(REPO),
            ],
            check=True,
        )
        (wheel,) = tmp.glob("cute_aot-*.whl")
        bare, installed = _venv(tmp / "bare"), _venv(tmp / "installed")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(installed),
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                str(wheel),
            ],
            check=True,
        )
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_AOT_")}
        cases = {
            "without cute-aot": (bare, clean),
            "with cute-aot, no variable": (installed, clean),
            "with cute-aot, CUTE_AOT_CACHE_DIR set": (
                installed,
                {**clean, "CUTE_AOT_CACHE_DIR": str(tmp / "c")},
            ),
            "with cute-aot, CUTE_AOT_REPORT set (hook armed)": (
                installed,
                {**clean, "CUTE_AOT_REPORT": str(tmp / "r.json")},
            ),
        }
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):
            for name, (python, env) in cases.items():
                started = time.perf_counter()
                subprocess.run([str(python), "-c", "pass"], env=env, check=True)
                seconds[name].append(time.perf_counter() - started)
    medians = {name: 1e3 * statistics.median(values) for name, values in seconds.items()}
    base = medians["without cute-aot"]
    result = {
        "runs": runs,
        "python": sys.version.split()[0],
        "median_ms": medians,
        "over_bare_ms": {name: value - base for name, value in medians.items()},
    }
    emit(result, out_path)


if __name__ == "__main__":
    main()
