# Sourced by the profile scripts (profile_prefill.sh, profile_decode.sh, profile_encode.sh), after
# scripts/gpu/configure.sh, with $OUT set:
# - profile_build TARGET configures build-gpu and builds TARGET (log $OUT/profile_build.log); exits on failure.
# - ncu_one_launch NAME KERNEL_REGEX LAUNCH_SKIP COMMAND... profiles one launch of the kernels matching
#   KERNEL_REGEX (past LAUNCH_SKIP of them) with the sections ncu_summary reads, plus memory and compute workload
#   analysis; report $OUT/NAME.ncu-rep, ncu's output in $OUT/ncu_NAME.txt; prints ncu's exit code.
# - ncu_summary REPORT [TOP] prints the
# summary of an Nsight Compute report made with the SpeedOfLight, WarpStateStats, SchedulerStats, InstructionStats,
# Occupancy and SourceCounters sections: the headline metrics, the pipes' utilisation, the stall reasons (cycles
# per issued instruction, largest first) and the TOP (default 45) SASS instructions with the most stall samples
# (scripts/gpu/ncu_hot_sass.py; the source page is kept as REPORT's name with _sass.csv).
ncu_summary() {
  local rep=$1 top=${2:-45}
  ncu --import "$rep" --print-summary none 2>/dev/null | grep -E \
    "Duration|Executed Ipc Active|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|Shared|Tensor|Pipe" \
    | sed -E 's/ +/ /g' | head -40
  ncu --import "$rep" --page raw 2>/dev/null \
    | grep -E "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active|sm__inst_executed_pipe_[a-z_]+.avg.pct_of_peak_sustained_active" \
    | sed -E 's/ +/ /g' | sort -k3 -g -r | head -12
  ncu --import "$rep" --page raw 2>/dev/null \
    | grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio" | sed -E 's/ +/ /g' | sort -k3 -g -r \
    | head -12
  ncu --import "$rep" --page source --csv --print-source sass 2>/dev/null > "${rep%.ncu-rep}_sass.csv"
  python3 scripts/gpu/ncu_hot_sass.py "$top" < "${rep%.ncu-rep}_sass.csv"
}

profile_build() {
  gpu_configure build-gpu "$OUT/profile_build.log" || { tail -30 "$OUT/profile_build.log"; exit 1; }
  cmake --build build-gpu -j16 --target "$1" >> "$OUT/profile_build.log" 2>&1 \
    || { grep -E "error" -A3 "$OUT/profile_build.log" | head -30; exit 1; }
}

ncu_one_launch() {
  local name=$1 kernel=$2 skip=$3
  shift 3
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section SourceCounters --import-source no -o "$OUT/$name" "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "ncu exit code: $?"
}
