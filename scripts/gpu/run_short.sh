#!/usr/bin/env bash
# Short GPU run (when little device time is left): build, every GPU test binary, the bench steps of
# scripts/gpu/steps/ (prefill, encode, ...), compute-sanitizer memcheck on *Small*; no decode benchmark, SDPA
# decode baseline or profile (those are in run_all.sh). Results in $OUT (logs packed into logs.tgz).
cd "$(dirname "$0")/../.."
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
source scripts/gpu/configure.sh
B=build-gpu
t0=$(date +%s)
gpu_configure $B $OUT/build.log || { tail -20 $OUT/build.log; exit 1; }
T=$(cmake --build $B --target help | grep -oE "kvcompact_cuda_[a-z0-9_]*(tests|bench)" | sort -u)
cmake --build $B -j16 --target $T >> $OUT/build.log 2>&1 || { grep -E "error" -A3 $OUT/build.log | head -40; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
for t in $B/tests/cuda/kvcompact_cuda_tests $B/tests/cuda_dsv4/kvcompact_cuda_dsv4_tests; do
  [ -x $t ] || continue
  timeout 120 $t > $OUT/$(basename $t).log 2>&1
  rc=$?  # (before any command substitution, which would reset $?)
  echo "$(basename $t) rc=$rc"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" -A3 $OUT/$(basename $t).log | head -30
  grep -E "^\[(prefill|encode-fast|dsv4[a-z-]*)\]" $OUT/$(basename $t).log | head -40
done
echo "tests done $(( $(date +%s) - t0 )) s"
for step in scripts/gpu/steps/*.sh; do
  # (The steps bound their own runs — tq_step.sh at 140 s; an outer timeout would kill only this wrapper.)
  echo "== $step"; BUILD=$B OUT=$OUT QUICK="" bash $step 2>&1 | tail -30
done
echo "steps done $(( $(date +%s) - t0 )) s"
for t in $B/tests/cuda/kvcompact_cuda_tests $B/tests/cuda_dsv4/kvcompact_cuda_dsv4_tests; do
  [ -x $t ] || continue
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 $t --gtest_filter='*Small*' > $OUT/memcheck_$(basename $t).log 2>&1
  rc=$?
  echo "memcheck $(basename $t) rc=$rc $(grep -E 'ERROR SUMMARY' $OUT/memcheck_$(basename $t).log | head -1)"
done
echo "all done $(( $(date +%s) - t0 )) s"
(cd $OUT && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
