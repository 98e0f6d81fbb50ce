#!/usr/bin/env bash
# Correctness checks of the GPU test binaries built on the development machine (scripts/gpu/ab_prebuild.sh, or
# scripts/gpu/carry_prebuilt.sh kvcompact_cuda_tests kvcompact_cuda_dsv4_tests [kvcompact_cuda_tq_step_bench] with
# BIN_DIR build/carry/build-gpu), run on the GPU machine without a build: every test of both binaries, then
# compute-sanitizer memcheck and racecheck on SANITIZE_FILTER (default the *Small* suites, the two-stream test and the
# plan checks); with REPEAT_FILTER, those TurboQuant tests REPEAT times more (default 15); with STEPS, those bench
# steps of scripts/gpu/steps/ (e.g. STEPS=tq_step) on the same executables, last, or first with STEPS_FIRST=1 (so
# that a short device call gets the benchmark figures before the sanitizers). Carry ".deps" and ".ab" (or
# "build/carry"); gzipped executables are unpacked first. Each step gets at most what is left of DEADLINE seconds
# (default 540, so that the device call's 600 s limit is not reached), so a slow step cuts the later ones short
# rather than the whole run; a step that ran out says so. Logs packed into $OUT/checks_logs.tgz (the device tool
# brings back at most 8 files); a bench step's CSV stays beside it. Exit code: the first failing step's.
# Usage: [SANITIZE_FILTER=…] [REPEAT_FILTER=… [REPEAT=N]] [STEPS="tq_step …" [STEPS_FIRST=1]]
#        scripts/gpu/prebuilt_checks.sh [BIN_DIR]
#        (BIN_DIR default .ab/new/build-gpu)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
BIN="${1:-.ab/new/build-gpu}"
DEADLINE="${DEADLINE:-540}"
FILTER="${SANITIZE_FILTER:-*Small*:CudaCacheStreams.*:CudaCache.PlansOf*}"
[ -d .deps/usr ] && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
rc=0
trap '(cd "$OUT" && tar czf checks_logs.tgz --remove-files ./*.log 2>/dev/null)' EXIT

# step NAME LOG CMD...: runs CMD under what is left of the deadline; prints its exit code and elapsed time.
step() {
  local name=$1 log=$2 left code
  shift 2
  left=$(( DEADLINE - ($(date +%s) - t0) ))
  if [ "$left" -le 5 ]; then
    echo "$name: not run (deadline of $DEADLINE s reached)"
    [ "$rc" != 0 ] || rc=124
    return
  fi
  timeout "$left" "$@" > "$OUT/$log" 2>&1
  code=$?
  echo "$name: exit $code after $(( $(date +%s) - t0 )) s$([ "$code" = 124 ] && echo ' (timed out)')"
  [ "$rc" != 0 ] || rc=$code
}

bash scripts/gpu/ab_unpack.sh  # (executables that ab_park.sh gzipped to fit the carry)
if [ -d "$BIN" ]; then  # (carry_prebuilt.sh's gzipped executables)
  find "$BIN" -name '*.gz' -type f -exec gunzip -f {} +
  find "$BIN" -type f -path '*/tests/*' -exec chmod +x {} +
  find "$BIN" -type f -path '*/bench/*' -exec chmod +x {} +
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
# The bench steps of STEPS (before the tests with STEPS_FIRST=1, else after the sanitizers).
bench_steps() {
  local s
  for s in ${STEPS:-}; do
    [ -f "scripts/gpu/steps/$s.sh" ] || { echo "error: no bench step scripts/gpu/steps/$s.sh" >&2; [ "$rc" != 0 ] || rc=2; continue; }
    step "bench step $s" "step_$s.log" env BUILD="$BIN" OUT="$OUT" bash "scripts/gpu/steps/$s.sh"
    grep -vE '^$' "$OUT/step_$s.log" | head -24
  done
}
[ "${STEPS_FIRST:-0}" = 1 ] && bench_steps
binaries=("$BIN/tests/cuda/kvcompact_cuda_tests" "$BIN/tests/cuda_dsv4/kvcompact_cuda_dsv4_tests")
for t in "${binaries[@]}"; do
  [ -x "$t" ] || { echo "error: no test binary $t" >&2; exit 2; }
done
for t in "${binaries[@]}"; do
  n=$(basename "$t")
  step "$n" "$n.log" "$t"
  grep -E "^\[  (PASSED|FAILED) |: Failure$" -A3 "$OUT/$n.log" | head -20
done
for t in "${binaries[@]}"; do
  n=$(basename "$t")
  for tool in memcheck racecheck; do
    step "$tool $n" "${tool}_$n.log" compute-sanitizer --tool "$tool" --error-exitcode 3 "$t" --gtest_filter="$FILTER"
    echo "  $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/${tool}_$n.log" | head -1)" \
      "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/${tool}_$n.log" | head -2 | tr '\n' ' ')"
  done
done
if [ -n "${REPEAT_FILTER:-}" ]; then
  step "repeat ${REPEAT:-15}x $REPEAT_FILTER" repeat.log "${binaries[0]}" --gtest_filter="$REPEAT_FILTER" \
    --gtest_repeat="${REPEAT:-15}"
  echo "  $(grep -c '^\[  PASSED  \]' "$OUT/repeat.log") of ${REPEAT:-15} rounds passed"
fi
[ "${STEPS_FIRST:-0}" = 1 ] || bench_steps
exit "$rc"
