#!/usr/bin/env bash
# One GPU run of the TurboQuant chunked-prefill work in the working tree alone (no A/B sides: for a kernel whose
# comparison is inside the benchmark, e.g. the warpgroup kernel beside the portable one): builds the CUDA tests and
# the prefill benchmark, runs the prefill and device-cache tests (printing the head_dim-128 QJL lines), compute-
# sanitizer memcheck and racecheck on CudaPrefillSmall, then `kvcompact_cuda_tq_prefill_bench --quick`. Every step
# has a timeout, so a hang costs minutes, not the run. Output and logs in $OUT (prefill_quick.csv, tests.log, ...).
# Usage (GPU machine, carrying .deps): OUT=$OUT scripts/gpu/prefill_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/configure.sh
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
gpu_configure build-gpu "$OUT/build.log" &&
  cmake --build build-gpu -j16 --target kvcompact_cuda_tests kvcompact_cuda_tq_prefill_bench >> "$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
T=$(find build-gpu -name kvcompact_cuda_tests -type f | head -1)
P=$(find build-gpu -name kvcompact_cuda_tq_prefill_bench -type f | head -1)
timeout 120 "$T" --gtest_filter='CudaPrefill*:CudaCache.*' > "$OUT/tests.log" 2>&1
rc=$?
echo "tests rc $rc"
grep -E "d=128.*prod" "$OUT/tests.log" | sed 's/entries(len\/first+rows)=[^ ]* //' | cut -c1-220
grep -E "^\[  (PASSED|FAILED)" "$OUT/tests.log"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 3 "$T" --gtest_filter='CudaPrefillSmall*' > "$OUT/$tool.log" 2>&1
  trc=$?
  [ "$trc" -eq 0 ] || rc=$trc
  echo "$tool rc $trc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | head -1)"
done
timeout 90 "$P" --quick --csv "$OUT/prefill_quick.csv" 2>&1 | tail -25
exit "$rc"
