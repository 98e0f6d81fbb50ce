#!/usr/bin/env bash
# Nsight Compute on the fast encode kernel of the working tree on the GPU machine: builds the encode benchmark,
# profiles one launch of its quick run (LAUNCH_SKIP: 2 = recommended, 9 = seed mode; bf16, head_dim 128) with
# speed of light, warp states, scheduler, instruction, launch statistics and per-instruction counters (executed
# instructions and stall samples). Report in $OUT/encode.ncu-rep, the per-instruction page in
# $OUT/encode_sass.csv (scripts/dev/encode_step_mix.py turns it into instructions per warp step by region),
# a summary on stdout (scripts/gpu/ncu_summary.sh).
# Usage: LAUNCH_SKIP=2 scripts/gpu/profile_encode.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
source scripts/gpu/configure.sh
source scripts/gpu/ncu_summary.sh
profile_build kvcompact_cuda_tq_encode_bench
echo "== ncu: encode_fast_kernel, launch ${LAUNCH_SKIP:-2} of the quick run"
ncu_one_launch encode encode_fast_kernel "${LAUNCH_SKIP:-2}" build-gpu/src/cuda/bench/kvcompact_cuda_tq_encode_bench --quick
ncu_summary "$OUT/encode.ncu-rep" 30
