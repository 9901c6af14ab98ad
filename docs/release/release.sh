#!/usr/bin/env bash
# The release pipeline's steps: the GitHub Actions workflow and the Kubernetes Jobs beside this
# file run exactly these (tests/test_release_example.py runs them as separate processes).
#
#   release.sh shard I N   build slice I of N into $WORK/shards/   (one CI matrix job / one pod each)
#   release.sh publish     merge every shard, sign, write one wheel per architecture into
#                          $WORK/dist/, push the bundles to $RELEASE_URL
#
# Environment: ARCHES (default sm_90a,sm_100a), BUILD_ARGS (more aot-build options, e.g.
# --model NAME), WORK (default ./release), SIGN_KEY (ed25519 PEM; omit to publish unsigned),
# RELEASE_URL (any fsspec URL, e.g. s3://bucket/cute-aot/<version>/; omit to skip the push),
# CACHE_DIR (a build cache shared by the shards, optional).
set -euo pipefail
ARCHES=${ARCHES:-sm_90a,sm_100a}
WORK=${WORK:-release}
read -r -a extra <<< "${BUILD_ARGS:-}"
cache=(); [ -n "${CACHE_DIR:-}" ] && cache=(--cache-dir "$CACHE_DIR")
sign=(); [ -n "${SIGN_KEY:-}" ] && sign=(--sign-key "$SIGN_KEY")

case "${1:-}" in
  shard)
    aot-build --arch "$ARCHES" "${extra[@]}" "${cache[@]}" --quiet --shard "$2/$3" --out "$WORK/shards"
    ;;
  publish)
    aot-build merge "$WORK/shards" --out "$WORK/bundles" "${cache[@]}" "${sign[@]}" --wheel
    mkdir -p "$WORK/dist"
    mv "$WORK"/bundles/*.whl "$WORK/dist/"
    if [ -n "${RELEASE_URL:-}" ]; then
      aot-cache push "$WORK"/bundles/*.cuteaot "$RELEASE_URL"
    fi
    ;;
  *)
    echo "usage: release.sh shard I N | release.sh publish" >&2
    exit 2
    ;;
esac
