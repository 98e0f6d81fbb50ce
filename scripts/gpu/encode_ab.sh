#!/usr/bin/env bash
# A/B of the TurboQuant encode kernels on the GPU machine, every side measured in the same run: the working tree
# ("new") against the revisions exported by scripts/gpu/dsv4_ab_prepare.sh into .ab/<side> (carry ".ab"). Builds
# every side concurrently (the encode benchmark, and the CUDA tests for the new side), runs the new side's encode
# tests (bytes against the CPU codec) and compute-sanitizer memcheck / racecheck on CudaEncodeSmall (TESTS=0
# skips them), then the encode benchmark (BENCH_ARGS, default the full table) on every side, alternating, ROUNDS
# times, and prints per case and side the mean µs and side / base. CSV of every run in $OUT/encode_ab.csv.
# Usage: scripts/gpu/encode_ab.sh [ROUNDS]   (default 2)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/ab_common.sh
BENCH_ARGS="${BENCH_ARGS:-}"
ROUNDS="${1:-2}"
ab_build_and_check kvcompact_cuda_tq_encode_bench encode 'CudaEncode*:EncodeQuantiser*:CudaCache.*' \
  'CudaEncodeSmall*' '^\[encode' 300
rc=$CHECK_RC
# Benchmark lines: kernel mode d dtype rows us GB/s %copy.
ab_bench_rounds src/cuda/bench/kvcompact_cuda_tq_encode_bench "$OUT/encode_ab.csv" \
  "round,side,kernel,mode,head_dim,dtype,us" '
  ($1 == "fast" || $1 == "general") && NF == 8 { gsub(/,/, ";", $2); print r "," s "," $1 "," $2 "," $3 "," $4 "," $6 }'
python3 scripts/gpu/ab_table.py "$OUT/encode_ab.csv" kernel,mode,head_dim,dtype us
ab_pack_logs
exit "$rc"
