#!/usr/bin/env bash
# A/B of the TurboQuant fused decode kernel on the GPU machine, every side measured in the same run: the working
# tree ("new") against the revisions exported by scripts/gpu/dsv4_ab_prepare.sh into .ab/<side> (carry ".ab").
# Builds every side concurrently (the decode benchmark, and the CUDA tests for the new side), runs the new side's
# decode tests (against the float64 oracle) and compute-sanitizer memcheck / racecheck on CudaSmall (TESTS=0 skips
# them), then the decode cases CASES (comma-separated "mode batch context") on every side, alternating, ROUNDS
# times, and prints per case and side the mean µs and side / base. CSV of every run in $OUT/tq_decode_ab.csv.
# Usage: CASES='recommended 64 131072,seed 8 32768' scripts/gpu/tq_decode_ab.sh [ROUNDS]   (default 2)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/ab_common.sh
CASES="${CASES:-recommended 64 131072,recommended 8 32768,recommended 1 131072,seed 64 131072,seed 8 32768,seed 1 131072}"
ROUNDS="${1:-2}"
BENCH_ARGS=""
IFS=',' read -ra LIST <<< "$CASES"
for c in "${LIST[@]}"; do BENCH_ARGS+=" --only $c"; done
ab_build_and_check kvcompact_cuda_bench tq_decode 'CudaDecode*:CudaCache*:CudaSmall*' 'CudaSmall*' '^\[decode' 300
rc=$CHECK_RC
# Benchmark lines: mode batch context splits us bytes GB/s %copy.
ab_bench_rounds src/cuda/bench/kvcompact_cuda_bench "$OUT/tq_decode_ab.csv" "round,side,mode,batch,context,us" '
  ($1 == "recommended" || $1 == "seed") && NF == 8 { print r "," s "," $1 "," $2 "," $3 "," $5 }'
python3 scripts/gpu/ab_table.py "$OUT/tq_decode_ab.csv" mode,batch,context us
ab_pack_logs
exit "$rc"
