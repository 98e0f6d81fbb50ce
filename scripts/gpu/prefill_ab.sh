#!/usr/bin/env bash
# A/B of the TurboQuant chunked-prefill kernels on the GPU machine, every side measured in the same run: the
# working tree ("new") against the revisions exported by scripts/gpu/dsv4_ab_prepare.sh (which exports any
# revisions, not only DeepSeek-V4 ones, into .ab/<side>; carry ".ab"). Builds every side concurrently (the
# prefill benchmark, and the CUDA tests for the new side), runs the new side's prefill tests and compute-sanitizer
# memcheck / racecheck on CudaPrefillSmall (TESTS=0 skips them), then the benchmark with BENCH_ARGS (default
# --quick) on every side, alternating, ROUNDS times, and prints per case and side the mean µs and side / base.
# CSV of every run in $OUT/prefill_ab.csv.
# Usage: scripts/gpu/prefill_ab.sh [ROUNDS]   (default 2)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/ab_common.sh
BENCH_ARGS="${BENCH_ARGS:---quick}"
ROUNDS="${1:-2}"
ab_build_and_check kvcompact_cuda_tq_prefill_bench prefill 'CudaPrefill*:CudaCache.*' 'CudaPrefillSmall*' \
  '^\[prefill' 200
rc=$CHECK_RC
# Benchmark lines: mode prec [kernel] context chunk us TFLOP/s rows/blk occ [splits] (older trees print no kernel
# column).
ab_bench_rounds src/cuda/bench/kvcompact_cuda_tq_prefill_bench "$OUT/prefill_ab.csv" \
  "round,side,mode,precision,kernel,context,us" '
  ($1 == "recommended" || $1 == "seed") && NF >= 8 {
    if (NF >= 9) print r "," s "," $1 "," $2 "," $3 "," $4 "," $6;
    else print r "," s "," $1 "," $2 ",-," $3 "," $5 }'
python3 scripts/gpu/ab_table.py "$OUT/prefill_ab.csv" mode,precision,kernel,context us
ab_pack_logs
exit "$rc"
