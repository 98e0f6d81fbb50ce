#!/usr/bin/env bash
# Step of scripts/gpu/run_all.sh: CUDA encode throughput (encode_append, the fast kernel at head_dim 64 / 128 /
# 256 and the general one for comparison) per mode and input dtype, as GB/s and % of the copy bandwidth of the
# same run (issue 4 target: >= 60 %). Env: BUILD (build dir), OUT (results dir), QUICK ("--quick" or empty).
# Writes $OUT/tq_encode.csv and prints the table; the benchmark runs under a timeout (step < 90 s).
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
QUICK="${QUICK:-}"
mkdir -p "$OUT"
BIN="$BUILD/src/cuda/bench/kvcompact_cuda_tq_encode_bench"
if [ ! -x "$BIN" ]; then
  echo "missing $BIN (not built?)"
  exit 0
fi
timeout -k 5 80 "$BIN" $QUICK --csv "$OUT/tq_encode.csv" > "$OUT/tq_encode_bench.log" 2>&1
echo "encode bench exit code: $? (124 = timed out)"
grep -vE "^$" "$OUT/tq_encode_bench.log" | head -38
