#!/usr/bin/env bash
# Where the time of small decode launches goes, on the GPU machine: the benchmark's event-timed µs for each case
# beside the GPU durations of its kernels (Nsight Compute, gpu__time_duration per launch, one call's kernels past
# the warm-up). The difference is launch latency and gaps between the kernels.
# Usage: scripts/gpu/decode_latency_probe.sh ["MODE BATCH CONTEXT,..."]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
source scripts/gpu/configure.sh
CASES="${1:-recommended 1 4096,recommended 1 32768,recommended 1 131072,recommended 8 32768}"
gpu_configure build-gpu "$OUT/probe_build.log" || { tail -30 "$OUT/probe_build.log"; exit 1; }
cmake --build build-gpu -j16 --target kvcompact_cuda_bench >> "$OUT/probe_build.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/probe_build.log" | head -30; exit 1; }
bench=build-gpu/src/cuda/bench/kvcompact_cuda_bench
IFS=',' read -ra list <<< "$CASES"
for c in "${list[@]}"; do
  read -ra a <<< "$c"
  echo "== ${a[*]}"
  "$bench" --only "${a[@]}" 2>&1 | grep -E "^${a[0]} " || true
  timeout 60 ncu --clock-control none -k "regex:decode_kernel|merge_kernel" --launch-skip 6 --launch-count 4 --metrics gpu__time_duration.sum \
    "$bench" --only "${a[@]}" 2>&1 | grep -E "kernel|gpu__time_duration" | sed 's/^ *//' | paste - - | \
    awk '{print "   " $1, $(NF-1), $NF}'
done
