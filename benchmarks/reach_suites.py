"""How much of a real GPU's recording a virtual GPU reaches, on other libraries' own test files.

The same selection of tests runs three times: recorded on a CPU-only machine under
CUTE_AOT_VIRTUAL=h200, recorded for real on a GPU (plain JIT plus the recorder: its outcomes are
the JIT's), and served on the GPU from bundles built on the CPU from the virtual recording
(CUTE_AOT_MODE=aot). `run` runs the suites under whatever CUTE_AOT_* the caller set; `table`
compares the three, call by call (`aot-cache records`' comparison), and test by test.

    CUTE_AOT_VIRTUAL=h200 python benchmarks/reach_suites.py run --quack Q --flashinfer F --out v/
    aot-build --from-record v/NAME.record/ --arch sm90a --out bundles/      # each suite, on CPU
    python benchmarks/reach_suites.py run --quack Q --flashinfer F --out real/          # on the GPU
    CUTE_AOT_BUNDLES=bundles/ CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \\
        python benchmarks/reach_suites.py run --quack Q --flashinfer F --out served/   # on the GPU
    python benchmarks/reach_suites.py table --virtual v/ --real real/ --served served/ --out t.json

Q and F are folders holding the libraries' test files (quack's `tests/`, FlashInfer's
`tests/gdn/`, as the SUITES below name them); the test files are theirs, not ours. Suites kept
for acceptance (FlashInfer's test_norm and test_decode_delta_rule; quack's rmsnorm, softmax,
cross_entropy and layernorm tests; FlashAttention-4's tests) are left out on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import click

# name -> (library, pytest arguments from that library's test root); backward passes in quack's
# linear, rotary, linear-cross-entropy and topk tests
SUITES = {
    "quack_linear": (
        "quack",
        [
            "tests/test_linear.py::test_linear",
            "tests/test_linear.py::test_linear_act",
            "tests/test_linear.py::test_dact_linear_partial_grad",
            "tests/test_linear.py::test_linear_act_partial_grad",
        ],
    ),
    "quack_rotary": (
        "quack",
        ["tests/test_rotary.py::test_rotary_emb_qkv", "tests/test_rotary.py::test_rotary_emb_func"],
    ),
    "quack_linear_cross_entropy": (
        "quack",
        ["tests/test_linear_cross_entropy.py::test_chunked_linear_cross_entropy"],
    ),
    "quack_topk": ("quack", ["tests/test_topk.py", "-k", "input_dtype0"]),  # bf16
    "flashinfer_gdn_padded_pool": (
        "flashinfer",
        ["tests/gdn/test_decode_pretranspose_bf16_padded_pool.py"],
    ),
    "flashinfer_gdn_noncontiguous_pool": (
        "flashinfer",
        ["tests/gdn/test_decode_pretranspose_noncontiguous_pool.py"],
    ),
}


@click.group()
def main():
    """Run the suites, or compare their recordings."""


@main.command()
@click.option("--quack", "quack_root", type=click.Path(file_okay=False), required=True)
@click.option("--flashinfer", "flashinfer_root", type=click.Path(file_okay=False), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.argument("names", nargs=-1)
def run(quack_root, flashinfer_root, out, names):
    """Run NAMES (default: every suite) with pytest, each recorded and reported under OUT."""
    roots = {"quack": Path(quack_root).resolve(), "flashinfer": Path(flashinfer_root).resolve()}
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in names or SUITES:
        library, selection = SUITES[name]
        env = {
            **os.environ,
            "CUTE_AOT_RECORD": f"{out}/{name}.record/",
            "CUTE_AOT_REPORT": f"{out}/{name}.report.json",
            # the libraries' own disk caches would serve what each run is to show
            "QUACK_CACHE_ENABLED": "0",
            "FLASHINFER_CUTE_DSL_DISABLE_CACHE": "1",
        }
        if "CUTE_AOT_BUNDLES" in env:  # serving: nothing to record
            del env["CUTE_AOT_RECORD"]
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        argv += ["--noconftest"] if library == "quack" else []  # quack's conftest pins a GPU
        argv += [f"--junitxml={out}/{name}.xml", *selection]
        started = time.perf_counter()
        with open(out / f"{name}.log", "w") as log:
            done = subprocess.run(argv, cwd=roots[library], env=env, stdout=log, stderr=log)
        wall = round(time.perf_counter() - started, 1)
        row = {"suite": name, "rc": done.returncode, "wall_s": wall, **_outcomes(out, name)}
        with open(out / "runs.jsonl", "a") as runs:
            runs.write(json.dumps(row) + "\n")
        click.echo(f"{name}: rc {done.returncode}, {wall} s, {row['counts']}")


def _outcomes(folder: Path, name: str) -> dict:
    """{"counts": {outcome: n}, "tests": {test id: outcome}} from a suite's JUnit XML."""
    path = folder / f"{name}.xml"
    if not path.exists():
        return {"counts": {}, "tests": {}}
    tests = {}
    for case in ElementTree.parse(path).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        tests[test] = next(
            (kind for kind in ("error", "failure", "skipped") if kind in kinds), "passed"
        )
    counts: dict[str, int] = {}
    for outcome in tests.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"counts": counts, "tests": tests}


@main.command()
@click.option("--virtual", type=click.Path(file_okay=False), required=True)
@click.option("--real", type=click.Path(file_okay=False), required=True)
@click.option("--served", type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True)
def table(virtual, real, served, out):
    """Per suite: tests, real and virtual kernels, the same, only in one, differing; served."""
    from cute_aot.aot.tools.aot_cache.records import compare

    rows = []
    for name in SUITES:
        if not (Path(real) / f"{name}.record").exists():
            continue
        calls = {
            side: _records(Path(folder) / f"{name}.record")
            for side, folder in (("virtual", virtual), ("real", real))
        }
        found = compare(calls["real"], calls["virtual"])
        real_kernels, virtual_kernels = found["kernels"]
        row = {
            "suite": name,
            "library": SUITES[name][0],
            "selection": SUITES[name][1],
            "tests": {
                side: _outcomes(Path(folder), name)["counts"]
                for side, folder in (("virtual", virtual), ("real", real))
            },
            "real_kernels": real_kernels,
            "virtual_kernels": virtual_kernels,
            "identical": found["same"],
            "reach": round(found["same"] / real_kernels, 4) if real_kernels else None,
            "only_real": found["only_a"],
            "only_virtual": found["only_b"],
            "differing": found["differing"],
            "not_recordable": dict(zip(("real", "virtual"), found["not_recordable"], strict=True)),
            "wall_s": {
                side: _wall(Path(folder), name)
                for side, folder in (("virtual", virtual), ("real", real))
            },
        }
        if served:
            row["served"] = _served(Path(real), Path(served), name)
        rows.append(row)
        click.echo(
            f"{name}: real {real_kernels}, virtual {virtual_kernels}, identical "
            f"{found['same']}, only real {len(found['only_a'])}, only virtual "
            f"{len(found['only_b'])}, differing {len(found['differing'])}"
            + (f"; served: {row['served']['summary']}" if served else "")
        )
    Path(out).write_text(json.dumps({"suites": rows}, indent=1) + "\n")


def _records(folder: Path) -> list[dict]:
    from cute_aot.kernels.recorded import read_records

    return [record for _, record in read_records(str(folder))] if folder.exists() else []


def _wall(folder: Path, name: str):
    path = folder / "runs.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return next((row["wall_s"] for row in reversed(rows) if row["suite"] == name), None)


def _served(real: Path, served: Path, name: str) -> dict:
    """Compiles while served, and every test whose outcome differs from the JIT run's."""
    report_path = served / f"{name}.report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    jit, aot = _outcomes(real, name)["tests"], _outcomes(served, name)["tests"]
    changed = {
        test: [jit.get(test), aot.get(test)]
        for test in jit.keys() | aot.keys()
        if jit.get(test) != aot.get(test)
    }
    summary = (
        f"{report.get('compiles')} compiles, {report.get('hits')} hits, "
        f"{len(changed)} outcomes unlike JIT's"
    )
    return {
        "compiles": report.get("compiles"),
        "hits": report.get("hits"),
        "misses": report.get("misses"),
        "outcomes_unlike_jit": dict(sorted(changed.items())),
        "summary": summary,
    }


if __name__ == "__main__":
    main()
