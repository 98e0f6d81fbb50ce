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
gpu_configure build-gpu "$OUT/profile_build.log" || { tail -30 "$OUT/profile_build.log"; exit 1; }
cmake --build build-gpu -j16 --target kvcompact_cuda_bench >> "$OUT/profile_build.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/profile_build.log" | head -30; exit 1; }
echo "== ncu: decode_kernel, ${CASE[*]}"
timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none -k "regex:decode_kernel" \
  --launch-skip "${LAUNCH_SKIP:-3}" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section SourceCounters --import-source no -o "$OUT/decode" \
  build-gpu/src/cuda/bench/kvcompact_cuda_bench --only "${CASE[@]}" > "$OUT/ncu_decode.txt" 2>&1
echo "ncu exit code: $?"
ncu_summary "$OUT/decode.ncu-rep" 45
