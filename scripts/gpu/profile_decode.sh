#!/usr/bin/env bash
# Nsight Compute on the TurboQuant fused decode kernel on the GPU machine: builds the decode benchmark, runs one
# case (`--only MODE BATCH CONTEXT`) under ncu on one launch of decode_kernel (LAUNCH_SKIP, default 3: past the
# warm-up), with speed of light, warp states, scheduler, instruction, memory and launch statistics and
# per-instruction stall samples. Report in $OUT/decode.ncu-rep, a summary on stdout (scripts/gpu/ncu_summary.sh).
# Usage: scripts/gpu/profile_decode.sh [MODE BATCH CONTEXT]   (default recommended 64 32768)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
source scripts/gpu/configure.sh
source scripts/gpu/ncu_summary.sh
CASE=("$@")
[ ${#CASE[@]} -eq 3 ] || CASE=(recommended 64 32768)
profile_build kvcompact_cuda_bench
echo "== ncu: decode_kernel, ${CASE[*]}"
ncu_one_launch decode decode_kernel "${LAUNCH_SKIP:-3}" build-gpu/src/cuda/bench/kvcompact_cuda_bench --only "${CASE[@]}"
ncu_summary "$OUT/decode.ncu-rep" 45
