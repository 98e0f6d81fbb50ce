#!/usr/bin/env bash
# Nsight Compute on the chunked-prefill warpgroup kernel on the GPU machine: builds the prefill benchmark, runs one
# case (`--only recommended CONTEXT`, hilo, the warpgroup kernel) under ncu on one launch (LAUNCH_SKIP, default 2:
# past the warm-up), with speed of light, warp states, scheduler, instruction, memory and launch statistics and
# per-instruction stall samples. Report in $OUT/prefill.ncu-rep, a summary on stdout.
# Usage: scripts/gpu/profile_prefill.sh [CONTEXT]   (default 32768)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
source scripts/gpu/configure.sh
gpu_configure build-gpu "$OUT/profile_build.log" || { tail -30 "$OUT/profile_build.log"; exit 1; }
cmake --build build-gpu -j16 --target kvcompact_cuda_tq_prefill_bench >> "$OUT/profile_build.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/profile_build.log" | head -30; exit 1; }
timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none -k "regex:prefill_wgmma_kernel" \
  --launch-skip "${LAUNCH_SKIP:-2}" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section SourceCounters --import-source no -o "$OUT/prefill" \
  build-gpu/src/cuda/bench/kvcompact_cuda_tq_prefill_bench --only recommended "${1:-32768}" > "$OUT/ncu_prefill.txt" 2>&1
echo "ncu exit code: $?"
source scripts/gpu/ncu_summary.sh
ncu_summary "$OUT/prefill.ncu-rep" 45
