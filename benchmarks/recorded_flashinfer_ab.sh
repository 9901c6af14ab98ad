#!/usr/bin/env bash
# Two cute-aot wheels side by side on one GPU machine: each builds the sweep's record with the
# GPU hidden, then serves the sweep in mode aot (recorded_flashinfer_phases.sh), in alternating
# rounds, so that what a served cute.compile call costs is compared in one run; then each serves
# the record's calls replayed (the phase `replayed`), which the CPU-only machine measures too.
#   benchmarks/recorded_flashinfer_ab.sh OUT RECORD A.whl B.whl [ROUNDS]
# Needs the rest (cutlass-dsl, flashinfer, torch, tvm-ffi) importable from PYTHONPATH's /tmp/site.
set -euo pipefail
out=$1 record=$2; shift 2
wheels=("$1" "$2"); rounds=${3:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
for i in 0 1; do
  site=/tmp/site-ab$i
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[$i]}"
  printf "import site\nsite.addsitedir('%s')\nsite.addsitedir('/tmp/site')\n" "$site" > "$site/sitecustomize.py"
done
run() {  # run WHEEL_INDEX PHASE...
  PYTHONPATH=/tmp/site-ab$1:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$here \
    FROM="$record" bash "$here/benchmarks/recorded_flashinfer_phases.sh" "$out/w$1" "${@:2}"
}
for i in 0 1; do run $i build; done
for round in $(seq "$rounds"); do
  for i in 0 1; do run $i aot; cp "$out/w$i/aot.json" "$out/w$i/aot-$round.json"; done
done
# The same calls replayed as the CPU-only machine's benchmark makes them: this host against that.
for i in 0 1; do run $i replayed; done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
summary = {}
for i in (0, 1):
    rows = []
    for r in range(1, rounds + 1):
        each = json.load(open(f"{out}/w{i}/aot-{r}.json"))["compile_call_seconds_each"]
        rows.append({"first_ms": 1e3 * each[0], "later_median_ms": 1e3 * statistics.median(each[1:])})
    summary[f"wheel{i}"] = rows
    summary[f"wheel{i}_replayed"] = json.load(open(f"{out}/w{i}/replayed.json"))
json.dump(summary, open(f"{out}/ab.json", "w"), indent=1)
print(json.dumps(summary))
PY
