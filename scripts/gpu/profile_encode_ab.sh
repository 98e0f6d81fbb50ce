#!/usr/bin/env bash
# Nsight Compute on the fast encode kernel of every A/B side (the working tree "new" and the revisions exported
# by scripts/gpu/dsv4_ab_prepare.sh into .ab; carry ".ab"): one launch of the quick encode benchmark's case
# (LAUNCH_SKIP: 2 = recommended, 9 = seed mode; bf16, head_dim 128), speed of light, warp states, scheduler,
# instruction and launch statistics side by side. Reports in $OUT/encode_<side>.ncu-rep, text in
# $OUT/ncu_encode_<side>.txt, and a short per-side summary on stdout.
# Usage: LAUNCH_SKIP=9 scripts/gpu/profile_encode_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/ab_common.sh
BENCH=src/cuda/bench/kvcompact_cuda_tq_encode_bench
ab_sides
ab_build kvcompact_cuda_tq_encode_bench kvcompact_cuda_tq_encode_bench
for s in "${SIDES[@]}"; do
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none -k "regex:encode_fast_kernel" \
    --launch-skip "${LAUNCH_SKIP:-9}" --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section LaunchStats --section Occupancy -o "$OUT/encode_$s" \
    "${DIR[$s]}/build-gpu/$BENCH" --quick > "$OUT/ncu_encode_$s.txt" 2>&1
  echo "== $s (ncu exit $?)"
  ncu --import "$OUT/encode_$s.ncu-rep" --print-summary none 2>/dev/null | grep -E \
    "Duration|Executed Instructions  |Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Registers Per|Block Limit|Achieved Occupancy|Grid Size|Shared Memory Configuration Size|Dynamic Shared|Static Shared|Stall" \
    | sed -E 's/ +/ /g' | head -40
  # stall reasons, cycles per issued instruction (the largest first)
  ncu --import "$OUT/encode_$s.ncu-rep" --page raw 2>/dev/null \
    | grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio" | sed -E 's/ +/ /g' \
    | sort -k3 -g -r | head -10
done
# The reports and texts of every side in one archive (the device tool brings back at most 8 files).
(cd "$OUT" && pack_out encode_profiles $(ls encode_*.ncu-rep ncu_encode_*.txt 2>/dev/null) ab_build_*.log)
