#!/usr/bin/env bash
# The FlashInfer sweep (recorded_flashinfer.py) as a plain program: cute-aot is activated by the
# environment alone (the startup hook), in the three steps an unmodified server takes:
#   record  FlashInfer JIT-compiles as usual; CUTE_AOT_RECORD=<out>/records/ (one file per process)
#   build   aot-build --from-record on this host's CPUs, the GPU hidden (a GPU-less build)
#   aot     CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot: every kernel served from the bundle
#   replayed the record's calls made again as a CPU makes them (tensors over no memory) and
#           served from the bundle: benchmarks/served_first_use.py, the figure this CPU-only
#           machine measures too, here on the GPU host's CPU (<out>/replayed.json)
#   virtual the record step with no GPU: CUTE_AOT_VIRTUAL=${VIRTUAL:-h200} (runtime/virtual);
#           build it with FROM=<out>/virtual-records/, serve another bundle with BUNDLES=<dir>
# and the baselines for readiness: FlashInfer as it starts cold by default (JIT, each kernel then
# persisted to its disk cache), and FlashInfer started again on that warm disk cache.
# Each phase writes <out>/<phase>.json and, through CUTE_AOT_REPORT, <out>/<phase>.report.json.
#
#   benchmarks/recorded_flashinfer_phases.sh OUT record build aot compare-record jit disk compare
set -euo pipefail
out=$1; shift
mkdir -p "$out"
bench=(python3 benchmarks/recorded_flashinfer.py)
for phase in "$@"; do
  echo "== $phase $(date -u +%T)"
  case "$phase" in
    record) CUTE_AOT_RECORD="$out/records/" CUTE_AOT_REPORT="$out/record.report.json" \
              "${bench[@]}" run --phase record --out "$out/record.json" ;;
    virtual) time CUTE_AOT_VIRTUAL="${VIRTUAL:-h200}" CUTE_AOT_RECORD="$out/virtual-records/" \
               CUTE_AOT_REPORT="$out/virtual.report.json" "${bench[@]}" run --phase record \
               --out "$out/virtual.json" ;;
    build) time CUDA_VISIBLE_DEVICES= python3 -m cute_aot.aot.cli --from-record "${FROM:-$out/records/}" \
              --arch sm90a --out "$out/bundles" --name recorded --no-cache --quiet ;;
    aot) CUTE_AOT_BUNDLES="${BUNDLES:-$out/bundles}" CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \
           CUTE_AOT_REPORT="$out/aot.report.json" "${bench[@]}" run --phase aot --out "$out/aot.json" ;;
    replayed) CUTE_AOT_BUNDLES="${BUNDLES:-$out/bundles}" CUTE_AOT_INTERCEPT=1 CUTE_AOT_MODE=aot \
                python3 benchmarks/served_first_use.py "${FROM:-$out/records/}" --passes 4 \
                --out "$out/replayed.json" ;;
    jit) CUTE_AOT_REPORT="$out/jit.report.json" "${bench[@]}" run --phase jit --keep-disk-cache \
           --out "$out/jit.json" ;;
    disk) CUTE_AOT_REPORT="$out/disk.report.json" "${bench[@]}" run --phase disk \
            --out "$out/disk.json" ;;
    compare-record) "${bench[@]}" compare "$out/record.json" "$out/aot.json" \
                      --out "$out/compare_record.json" ;;
    compare) "${bench[@]}" compare "$out/jit.json" "$out/aot.json" "$out/disk.json" \
               --out "$out/compare.json" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
