#!/usr/bin/env bash
# Profile of the DeepSeek-V4 kernels of one decode case on the GPU machine: builds the DeepSeek-V4 benchmark,
# runs the case once (times, and whether any indexer row took the scalar path), then Nsight Compute on one
# launch of each kernel named in KERNELS (speed of light, warp stalls, occupancy, per-instruction SASS stall
# samples as <kernel>_sass.csv.gz), packed at the end (below).
# Usage: scripts/gpu/profile_dsv4.sh [STORAGE BATCH CONTEXT]   (default: bf16 8 1048576)
# Env: KERNELS (kernel-name regexes to profile in depth, default "score_kernel attention_split_kernel"; "" for
#        none), BREAKDOWN=1 (first the time per kernel of one step; STEP_KERNELS = launches in two steps, default
#        298 = 2 x 149 for V4-Flash: 21 ratio-4 layers x 5 kernels + 22 others x 2), WARP_SAMPLING (ncu --warp-sampling-interval; 0 = every 32 cycles, for
#        short kernels), TAG (suffix of the output names), BUILD, BIN (a prebuilt benchmark executable: no build;
#        e.g. .ab/new/build-gpu/src/cuda/bench/kvcompact_cuda_dsv4_decode_bench from ab_prebuild.sh, carrying .ab
#        and .deps), PROFILE_TIMEOUT (seconds per ncu run),
#        LAUNCH_SKIP (launches of the kernel skipped before the profiled one, default 2: for the attention
#        kernels of V4-Flash that is layer 2, a ratio-4 layer; 3 is layer 3, a ratio-128 one).
# Results: $OUT/profile<TAG>.tgz (build log, breakdown CSV, ncu reports as text, SASS stall samples; read the
#          latter with scripts/gpu/ncu_hot_sass.py and scripts/gpu/ncu_sass_summary.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
CASE=(bf16 8 1048576)
[ $# -gt 0 ] && CASE=("$@")
source scripts/gpu/configure.sh
if [ -n "${BIN:-}" ]; then
  # A benchmark built elsewhere (e.g. by scripts/gpu/ab_prebuild.sh on the development machine, carried in .ab):
  # nothing to build here; its shared libraries come from the carried .deps.
  [ -x "$BIN" ] || { echo "error: BIN=$BIN is not an executable" >&2; exit 2; }
  [ -d .deps/usr ] && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  echo "prebuilt benchmark: $BIN" > "$OUT/profile_build.log"
else
  BUILD="${BUILD:-build-gpu}"
  t0=$(date +%s)
  gpu_configure "$BUILD" "$OUT/profile_build.log" || { tail -30 "$OUT/profile_build.log"; exit 1; }
  cmake --build "$BUILD" -j16 --target kvcompact_cuda_dsv4_decode_bench >> "$OUT/profile_build.log" 2>&1 \
    || { grep -E "error" -A3 "$OUT/profile_build.log" | head -40; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  BIN="$BUILD/src/cuda/bench/kvcompact_cuda_dsv4_decode_bench"
fi
"$BIN" --only "${CASE[@]}" 2>&1 | tail -4
if [ "${BREAKDOWN:-0}" = 1 ]; then
  # Time per kernel of one decode step: the first two steps the benchmark enqueues (its warm-up), each kernel
  # timed alone by Nsight Compute (gpu__time_duration), summed per kernel name and divided by 2.
  echo "== per-kernel breakdown of one step, ${CASE[*]}"
  timeout "${PROFILE_TIMEOUT:-150}" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-count "${STEP_KERNELS:-298}" "$BIN" --only "${CASE[@]}" > "$OUT/breakdown${TAG:-}.csv" 2> /dev/null
  python3 - "$OUT/breakdown${TAG:-}.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = next(r for r in rows if "Kernel Name" in r)
k, v, u = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows:
    if r[k] == "Kernel Name":
        continue
    name = r[k].split("(")[0].split("::")[-1]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r[u]]
    tot[name] += float(r[v].replace(",", "")) * scale
    cnt[name] += 1
all_us = sum(tot.values()) / 2
for name, t in tot.most_common():
    print(f"{name:<28} {cnt[name] / 2:6.0f} launches {t / 2:10.1f} us  {100 * t / 2 / all_us:5.1f} %")
print(f"{'sum of kernel times':<28} {sum(cnt.values()) / 2:6.0f} launches {all_us:10.1f} us")
PY
fi
for k in ${KERNELS-score_kernel attention_split_kernel}; do
  echo "== ncu: $k, ${CASE[*]}"
  timeout "${PROFILE_TIMEOUT:-150}" ncu --clock-control none -k "regex:$k" --launch-skip "${LAUNCH_SKIP:-2}" --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters \
    --section InstructionStats --section SchedulerStats --import-source no -o "$OUT/$k${TAG:-}" \
    ${WARP_SAMPLING:+--warp-sampling-interval "$WARP_SAMPLING"} \
    "$BIN" --only "${CASE[@]}" > "$OUT/ncu_$k${TAG:-}.txt" 2>&1
  echo "ncu exit code: $?"
  if [ -f "$OUT/$k${TAG:-}.ncu-rep" ]; then
    ncu -i "$OUT/$k${TAG:-}.ncu-rep" --page details >> "$OUT/ncu_$k${TAG:-}.txt" 2>&1
    ncu -i "$OUT/$k${TAG:-}.ncu-rep" --page source --csv --print-source sass 2> /dev/null | gzip > "$OUT/${k}${TAG:-}_sass.csv.gz"
    rm -f "$OUT/$k${TAG:-}.ncu-rep"
  fi
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc Active|Stall|Warp Cycles Per Issued|Theoretical Occupancy|Block Limit|Grid Size|Dynamic Shared" "$OUT/ncu_$k${TAG:-}.txt" | head -40
done
# Everything but the printed summary as one file (profile<TAG>.tgz): the device tool brings back at most 8 files.
pack_out "profile${TAG:-}" profile_build.log "breakdown${TAG:-}.csv" $(cd "$OUT" && ls ncu_*"${TAG:-}".txt ./*"${TAG:-}"_sass.csv.gz 2>/dev/null)
