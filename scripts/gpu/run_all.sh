#!/usr/bin/env bash
# One run on the GPU machine: configure + build the CUDA backend, run the GPU tests, compute-sanitizer
# memcheck and racecheck on a small filter, the kvcompact CUDA benchmark, the torch SDPA bf16 baseline and the
# copy bandwidth in the same run, then print the table. CSVs and logs go to $OUT (default ./out).
# Usage: scripts/gpu/run_all.sh [--quick] [--no-sanitize] [--no-bench]
# Environment: STEPS (regex over scripts/gpu/steps/*.sh names, default all), DECODE_BENCH=0 (skip the decode
# benchmark, its SDPA baseline and its profile), PROFILE="MODE BATCH CONTEXT" (case of the decode profile, default
# "seed 32 32768"), PROFILE_SOURCE=1 (also per-instruction SASS stall samples of the decode kernel: sass.csv.gz),
# SANITIZE_TIMEOUT / PROFILE_TIMEOUT / TEST_TIMEOUT (seconds per tool / test-binary run), SUITE=dsv4 (only the
# DeepSeek-V4 targets: build, tests, sanitizers and benchmark steps; no TurboQuant tests, benchmark or profile),
# PREBUILT=DIR (no configure or build: the executables built on the development machine with the cuda-release
# preset, copied to DIR at their build-tree paths, optionally gzipped to fit the device tool's carry; DIR replaces
# BUILD), RUN_TESTS=0 (skip the GPU test binaries), PROFILE=none (skip the decode profile).
# Build dependencies: the system's, or a prefix in .deps/usr (copied from a Debian machine: fmt, gtest, ...).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
# The device tool returns at most 8 files: logs, text reports and the SASS samples go into one archive, the CSVs
# stay beside it — also when the run is cut short (the tool's time limit sends SIGTERM).
pack_logs() { (cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.txt ./sass.csv.gz 2>/dev/null); }
trap 'pack_logs; exit 143' TERM
trap 'pack_logs; exit 130' INT
QUICK=""; SANITIZE=1; BENCH=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK="--quick" ;;
    --no-sanitize) SANITIZE=0 ;;
    --no-bench) BENCH=0 ;;
  esac
done
BUILD="${BUILD:-build-gpu}"
source scripts/gpu/configure.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv 2>&1 | tee "$OUT/bench.log"
TQ=1
[ "${SUITE:-}" = dsv4 ] && TQ=0
if [ -n "${PREBUILT:-}" ]; then
  echo "== prebuilt executables in $PREBUILT (no build)"
  BUILD="$PREBUILT"
  find "$BUILD" -name '*.gz' -type f -exec gunzip -f {} +
  find "$BUILD" -type f -exec chmod +x {} +
  [ -d .deps/usr ] && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
else
  echo "== configure + build"
  t0=$(date +%s)
  gpu_configure "$BUILD" "$OUT/build.log" || { tail -30 "$OUT/build.log"; exit 1; }
  # Every CUDA test and benchmark executable (kvcompact_cuda_*), not the CPU suites.
  TARGETS=$(cmake --build "$BUILD" --target help 2>/dev/null | grep -oE "kvcompact_cuda_${SUITE:-}[a-z0-9_]*(tests|bench)" | sort -u)
  cmake --build "$BUILD" -j16 --target $TARGETS >> "$OUT/build.log" 2>&1 \
    || { grep -E "error|Error" -A3 "$OUT/build.log" | head -60; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
TESTS="$BUILD/tests/cuda/kvcompact_cuda_tests"
BENCHBIN="$BUILD/src/cuda/bench/kvcompact_cuda_bench"
# run_test_binary TITLE BINARY LOG LINES: runs one GPU test binary into $OUT/LOG, prints its test results,
# failures and the lines matching the regex LINES (the tests' own measurements); returns its exit code.
run_test_binary() {
  echo "== $1"
  timeout "${TEST_TIMEOUT:-300}" "$2" > "$OUT/$3" 2>&1
  local rc=$?
  grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) " "$OUT/$3" | head -40
  grep -E "Failure" -A7 "$OUT/$3" | head -80
  grep -E "$4" "$OUT/$3" | head -30
  return $rc
}
test_rc=0
if [ "$TQ" = 1 ] && [ "${RUN_TESTS:-1}" = 1 ]; then
  run_test_binary "GPU tests" "$TESTS" tests.log "^\[decode\]"
  test_rc=$?
  grep -E "^\[encode\]" "$OUT/tests.log" | grep -v " 0 records differ" | head -20
  echo "encode cases with identical bytes: $(grep -c " 0 records differ" "$OUT/tests.log") of $(grep -c "^\[encode\]" "$OUT/tests.log")"
  echo "tests exit code: $test_rc"
fi
DSV4_TESTS="$BUILD/tests/cuda_dsv4/kvcompact_cuda_dsv4_tests"
if [ -x "$DSV4_TESTS" ] && [ "${RUN_TESTS:-1}" = 1 ]; then
  run_test_binary "GPU tests (DeepSeek-V4)" "$DSV4_TESTS" tests_dsv4.log "^\[dsv4"
  dsv4_rc=$?
  echo "dsv4 tests exit code: $dsv4_rc"
  [ "$dsv4_rc" = 0 ] || test_rc=$dsv4_rc
fi
if [ "$BENCH" = 1 ] && [ "$TQ" = 1 ] && [ "${DECODE_BENCH:-1}" = 1 ]; then
  echo "== kvcompact CUDA benchmark"
  "$BENCHBIN" $QUICK --csv "$OUT/tq_bench.csv" 2>&1 | tee -a "$OUT/bench.log" | tail -40
  echo "== torch SDPA bf16 baseline"
  PYTHONUNBUFFERED=1 python3 scripts/gpu/sdpa_baseline.py $QUICK --csv "$OUT/sdpa.csv" 2>&1 | tee -a "$OUT/bench.log" | tail -30
  echo "== report"
  python3 scripts/gpu/report.py "$OUT/tq_bench.csv" "$OUT/sdpa.csv" "$OUT/report.csv"
fi
if [ "$BENCH" = 1 ]; then
  # Further benchmark steps (prefill, DeepSeek-V4, ...): each scripts/gpu/steps/*.sh gets BUILD, OUT, QUICK.
  for step in scripts/gpu/steps/*.sh; do
    [ -f "$step" ] || continue
    [[ "$(basename "$step" .sh)" =~ ${STEPS:-.} ]] || continue
    echo "== step $(basename "$step")"
    BUILD="$BUILD" OUT="$OUT" QUICK="$QUICK" bash "$step" 2>&1 | tee -a "$OUT/steps.log" | tail -60
  done
fi
if [ "$BENCH" = 1 ] && [ "$TQ" = 1 ] && [ "${DECODE_BENCH:-1}" = 1 ] && [ "${PROFILE:-}" != none ] \
   && command -v ncu > /dev/null; then
  # One profile of the fused decode kernel (seed mode, batch 32, 32K): speed of light, memory, compute,
  # warp stalls, occupancy. Clocks are left alone (--clock-control none).
  CASE=(${PROFILE:-seed 32 32768})
  echo "== ncu: decode_kernel, ${CASE[*]}"
  SOURCE=()
  [ "${PROFILE_SOURCE:-0}" = 1 ] && SOURCE=(--section SourceCounters --section InstructionStats --section SchedulerStats
                                          --import-source no -o "$OUT/decode_profile")
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none -k regex:decode_kernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats "${SOURCE[@]}" \
    "$BENCHBIN" --only "${CASE[@]}" > "$OUT/ncu.txt" 2>&1
  echo "ncu exit code: $?"
  if [ -f "$OUT/decode_profile.ncu-rep" ]; then
    ncu -i "$OUT/decode_profile.ncu-rep" --page details >> "$OUT/ncu.txt" 2>&1
    ncu -i "$OUT/decode_profile.ncu-rep" --page source --csv --print-source sass 2> "$OUT/sass_err.txt" | gzip > "$OUT/sass.csv.gz"
    rm -f "$OUT/decode_profile.ncu-rep"
  fi
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|Issue Slots Busy|Executed Ipc Active|L1/TEX Hit|Stall|Warp Cycles Per Issued|Theoretical Occupancy|Block Limit" "$OUT/ncu.txt" | head -40
fi
if [ "$SANITIZE" = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    if [ "$TQ" = 1 ] && [ -x "$TESTS" ]; then
      echo "== compute-sanitizer $tool (*Small*)"
      timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$TESTS" --gtest_filter='*Small*' > "$OUT/sanitizer_run.log" 2>&1
      echo "$tool exit code: $? ; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" "$OUT/sanitizer_run.log" | head -4 | tr '\n' ' ')"
      cat "$OUT/sanitizer_run.log" >> "$OUT/sanitizer.log"; rm -f "$OUT/sanitizer_run.log"
    fi
    if [ -x "$DSV4_TESTS" ]; then
      echo "== compute-sanitizer $tool (DeepSeek-V4: *Small*)"
      timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$DSV4_TESTS" --gtest_filter='*Small*' > "$OUT/sanitizer_run.log" 2>&1
      echo "$tool exit code: $? ; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" "$OUT/sanitizer_run.log" | head -4 | tr '\n' ' ')"
      cat "$OUT/sanitizer_run.log" >> "$OUT/sanitizer.log"; rm -f "$OUT/sanitizer_run.log"
    fi
  done
fi
pack_logs
exit "$test_rc"
