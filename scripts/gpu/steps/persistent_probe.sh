#!/usr/bin/env bash
# Step of scripts/gpu/run_all.sh (and prebuilt_checks.sh's STEPS): the standalone probes that price a persistent
# batch-1 DeepSeek-V4 layer kernel (docs/cuda-dsv4-kernels-history.md) —
#   persistent_layer_probe (round 37): a grid barrier, a launch (from the host and inside a CUDA graph), a layer's
#     row reads and a dependent load;
#   grid_topk_probe (round 38): an exact top-512 of 262 144 scores as phases of the whole grid, checked against a
#     host sort (exit 1 on a mismatch).
# Each uses $BUILD/<probe> when it is there (built on the development machine and carried), else builds it with
# nvcc (≈ 20 s). Env: BUILD (build dir), OUT (results dir), PROBES (default both). Writes $OUT/<probe>.txt and
# prints it (≈ 10 s each). Exits with the first failing probe's code.
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
status=0
for probe in ${PROBES:-persistent_layer_probe grid_topk_probe}; do
  BIN="$BUILD/$probe"
  if [ ! -x "$BIN" ]; then
    BIN="$(mktemp -d)/$probe"
    nvcc -std=c++17 -O3 -arch=sm_90a -o "$BIN" "scripts/gpu/$probe.cu" || { echo "$probe: build failed"; status=1; continue; }
  fi
  timeout -k 5 60 "$BIN" > "$OUT/$probe.txt" 2>&1
  code=$?
  cat "$OUT/$probe.txt"
  echo "$probe exit code: $code (124 = timed out)"
  [ "$status" = 0 ] && status=$code
done
exit "$status"
