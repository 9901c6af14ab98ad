"""Cold start: time from a fresh process (after `import torch`) until every kernel of a set is
ready (loaded and looked up) and, on a GPU, has run once. Median of N fresh processes.

Methods:
  bundle            cute-aot: verify the bundle, dlopen its one library via TVM-FFI (no cutlass);
                    its library was verified when first extracted, later opens trust that copy
  bundle_reverify   the same with CUTE_AOT_REVERIFY=1: every open verifies the whole library
                    again (hashes, ELF, every key id), as every open did before
  peers_load_module one exported .o per kernel reloaded with cute.runtime.load_module, as
                    FlashInfer's CuTe DSL disk cache, quack and FlashAttention-4 do (imports
                    cutlass)
  flashinfer_hit    FlashInfer's own build_and_load_cute_dsl_kernel on a warm disk cache
                    (needs flashinfer-python; give its interpreter with --flashinfer-python)
  jit               import cutlass + cute.compile every kernel (what servers do today)

Sets come from benchmarks/make_sets.py. Writes JSON.

    python benchmarks/cold_start.py --sets benchmarks/sets --set router --set synthetic-100 \
        --method bundle --method peers_load_module --trials 5 \
        --out benchmarks/results/cold_start.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import click

PRELUDE = """
import json, os, sys, time
import torch
gpu = torch.cuda.is_available()
if gpu:
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
set_dir = sys.argv[1]
keys = json.load(open(os.path.join(set_dir, "keys.json")))
def call_all(functions):
    from cute_aot.kernels import family
    RouterGemmKey = family("router_gemm").Key
    for entry, function in zip(keys, functions):
        key = RouterGemmKey.from_fields(entry["fields"])
        m = key.m or 8
        k = key.k or 4096
        x = torch.ones(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(256, k, device="cuda", dtype=torch.bfloat16)
        function(x, w, torch.empty(m, 256, device="cuda"))
    torch.cuda.synchronize()
"""

CHILDREN = {
    "bundle": """
start = time.perf_counter()
import tvm_ffi
imported_tvm_ffi = time.perf_counter()
from cute_aot.runtime import open_bundle
imported = time.perf_counter()
bundle_path = [p for p in os.listdir(set_dir) if p.endswith(".cuteaot")][0]
bundle = open_bundle(os.path.join(set_dir, bundle_path), gpu_arch="sm_90a" if gpu else None)
opened = time.perf_counter()
functions = [bundle.function(entry["key_id"]) for entry in keys]
ready = time.perf_counter()
if gpu:
    call_all(functions)
end = time.perf_counter()
print(json.dumps({"ready_s": ready - start, "total_s": end - start,
                  "cutlass": "cutlass" in sys.modules,
                  "import_tvm_ffi_s": imported_tvm_ffi - start,
                  "import_cute_aot_s": imported - imported_tvm_ffi,
                  "open_bundle_s": opened - imported, "lookups_s": ready - opened}))
""",
    "bundle_reverify": None,  # the bundle child, with CUTE_AOT_REVERIFY=1
    "peers_load_module": """
start = time.perf_counter()
import cutlass.cute as cute
imported = time.perf_counter()
functions = []
for entry in keys:
    module = cute.runtime.load_module(
        os.path.join(set_dir, "objects", entry["symbol"] + ".o"), enable_tvm_ffi=True)
    functions.append(getattr(module, entry["symbol"]))
ready = time.perf_counter()
if gpu:
    call_all(functions)
end = time.perf_counter()
print(json.dumps({"ready_s": ready - start, "total_s": end - start,
                  "import_cutlass_s": imported - start}))
""",
    "flashinfer_hit": """
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
start = time.perf_counter()
from flashinfer.jit.cute_dsl_core import build_and_load_cute_dsl_kernel
imported = time.perf_counter()
def compile_fn_for(entry):
    def compile_fn():
        if os.environ.get("FI_MUST_HIT"):
            raise RuntimeError("cache miss during a hit measurement")
        from cute_aot.kernels import family
        router = family("router_gemm")
        return router.compile(router.Key.from_fields(entry["fields"]), "sm_90a")
    return compile_fn
functions = [build_and_load_cute_dsl_kernel("cuteaot_bench", entry["symbol"],
                                           compile_fn_for(entry)) for entry in keys]
ready = time.perf_counter()
end = time.perf_counter()
print(json.dumps({"ready_s": ready - start, "total_s": end - start,
                  "import_flashinfer_s": imported - start}))
""",
    "jit": """
start = time.perf_counter()
import cutlass.cute
imported = time.perf_counter()
from cute_aot.kernels import family
router = family("router_gemm")
functions = [router.compile(router.Key.from_fields(entry["fields"]), "sm_90a") for entry in keys]
ready = time.perf_counter()
if gpu:
    call_all(functions)
end = time.perf_counter()
print(json.dumps({"ready_s": ready - start, "total_s": end - start,
                  "import_cutlass_s": imported - start}))
""",
}


def run_child(python: str, method: str, set_dir: Path, env: dict) -> dict:
    if method == "bundle_reverify":
        method, env = "bundle", {**env, "CUTE_AOT_REVERIFY": "1"}
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(CHILDREN[method])
    result = subprocess.run(
        [python, "-c", code, str(set_dir)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise click.ClickException(f"{method} on {set_dir.name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--sets", "sets_dir", default="benchmarks/sets", type=click.Path(path_type=Path))
@click.option("--set", "set_names", multiple=True, default=["router"])
@click.option(
    "--method", "methods", multiple=True, default=["bundle_reverify", "bundle", "peers_load_module"]
)
@click.option("--trials", default=5, show_default=True)
@click.option("--flashinfer-python", default=None, help="Interpreter with flashinfer-python.")
@click.option("--out", "out_path", default="benchmarks/results/cold_start.json", show_default=True)
def main(sets_dir, set_names, methods, trials, flashinfer_python, out_path):
    scratch = Path(tempfile.mkdtemp(prefix="cute-aot-cold-"))
    env = {
        **os.environ,
        "CUTE_AOT_CACHE_DIR": str(scratch / "cute-aot"),
        "CUTE_AOT_MODE": "aot",
        "FLASHINFER_WORKSPACE_BASE": str(scratch / "flashinfer"),
        "PYTHONWARNINGS": "ignore",
    }
    report = {"trials": trials, "results": {}}
    for set_name in set_names:
        set_dir = sets_dir / set_name
        n_keys = len(json.loads((set_dir / "keys.json").read_text()))
        for method in methods:
            python = sys.executable
            if method == "flashinfer_hit":
                if not flashinfer_python:
                    continue
                python = flashinfer_python
                run_child(python, method, set_dir, env)  # fills FlashInfer's disk cache (a miss)
                env_hit = {**env, "FI_MUST_HIT": "1"}
            else:
                env_hit = env
            runs = [run_child(python, method, set_dir, env_hit) for _ in range(trials)]
            summary = {
                "keys": n_keys,
                "median_ready_s": statistics.median(r["ready_s"] for r in runs),
                "median_total_s": statistics.median(r["total_s"] for r in runs),
                "runs": runs,
            }
            report["results"][f"{set_name}/{method}"] = summary
            print(
                f"{set_name:16s} {method:18s} {n_keys:5d} keys: "
                f"ready {summary['median_ready_s'] * 1e3:9.1f} ms"
                f" | total {summary['median_total_s'] * 1e3:9.1f} ms",
                flush=True,
            )
    for set_name in set_names:
        ours = report["results"].get(f"{set_name}/bundle")
        for method in methods:
            other = report["results"].get(f"{set_name}/{method}")
            if ours and other and method != "bundle":
                ratio = other["median_total_s"] / ours["median_total_s"]
                report["results"][f"{set_name}/{method}"]["over_bundle"] = ratio
                print(f"{set_name}: {method} / bundle = {ratio:.1f}x")
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
