# Sourced by the profile scripts (profile_prefill.sh, profile_decode.sh): ncu_summary REPORT [TOP] prints the
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
