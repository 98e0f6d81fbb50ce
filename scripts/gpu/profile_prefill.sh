#!/usr/bin/env bash
# Nsight Compute on the chunked-prefill warpgroup kernel on the GPU machine: builds the prefill benchmark, runs one
# case (`--only recommended CONTEXT`, the default precision, the warpgroup kernel) under ncu on one launch (LAUNCH_SKIP, default 2:
# past the warm-up), with speed of light, warp states, scheduler, instruction, memory and launch statistics and
# per-instruction stall samples. Report in $OUT/prefill.ncu-rep, a summary on stdout.
# METRICS=1 adds a second pass over the same launch with the shared-memory and tensor-pipe counters (bank reads
# and writes, shared-memory wavefronts, gmma / hmma pipe activity) and the list of this ncu's metric names that
# mention them ($OUT/ncu_metric_names.txt): is the kernel bound by shared-memory bandwidth?
# Usage: [METRICS=1] scripts/gpu/profile_prefill.sh [CONTEXT]   (default 32768)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
source scripts/gpu/configure.sh
source scripts/gpu/ncu_summary.sh
profile_build kvcompact_cuda_tq_prefill_bench
ncu_one_launch prefill prefill_wgmma_kernel "${LAUNCH_SKIP:-2}" \
  build-gpu/src/cuda/bench/kvcompact_cuda_tq_prefill_bench --only recommended "${1:-32768}"
ncu_summary "$OUT/prefill.ncu-rep" 45
if [ "${METRICS:-0}" = 1 ]; then
  ncu --query-metrics --chip gh100 2>/dev/null | grep -iE "gmma|tensor_op|data_bank|mem_shared" \
    > "$OUT/ncu_metric_names.txt"
  names=$(awk '{print $1}' "$OUT/ncu_metric_names.txt" | grep -E "^(sm__pipe_tensor_op|sm__inst_executed_pipe_tensor|l1tex__data_bank|l1tex__data_pipe_lsu_wavefronts_mem_shared)" | sort -u)
  list=""
  for n in $names; do list="$list,$n.avg.pct_of_peak_sustained_elapsed"; done
  echo "== shared-memory and tensor-pipe counters (% of peak, elapsed cycles)"
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none -k "regex:prefill_wgmma_kernel" \
    --launch-skip "${LAUNCH_SKIP:-2}" --launch-count 1 --metrics "${list#,}" \
    build-gpu/src/cuda/bench/kvcompact_cuda_tq_prefill_bench --only recommended "${1:-32768}" > "$OUT/ncu_metrics.txt" 2>&1
  echo "ncu metrics exit code: $?"
  grep -E "pct_of_peak" "$OUT/ncu_metrics.txt" | sed -E 's/ +/ /g'
fi
