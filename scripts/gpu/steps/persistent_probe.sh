#!/usr/bin/env bash
# Step of scripts/gpu/run_all.sh (and prebuilt_checks.sh's STEPS): scripts/gpu/persistent_layer_probe.cu — one
# grid barrier, one back-to-back launch and a DeepSeek-V4 layer's row reads, the terms of the persistent batch-1
# layer kernel's bound (docs/cuda-dsv4-kernels-history.md, round 37). Uses $BUILD/persistent_layer_probe when it
# is there (built on the development machine and carried), else builds it with nvcc (≈ 20 s). Env: BUILD (build
# dir), OUT (results dir). Writes $OUT/persistent_layer_probe.txt and prints it (≈ 10 s).
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
BIN="$BUILD/persistent_layer_probe"
if [ ! -x "$BIN" ]; then
  BIN="$(mktemp -d)/persistent_layer_probe"
  nvcc -std=c++17 -O3 -arch=sm_90a -o "$BIN" scripts/gpu/persistent_layer_probe.cu || { echo "probe: build failed"; exit 1; }
fi
timeout -k 5 60 "$BIN" > "$OUT/persistent_layer_probe.txt" 2>&1
code=$?
cat "$OUT/persistent_layer_probe.txt"
echo "probe exit code: $code (124 = timed out)"
exit "$code"
