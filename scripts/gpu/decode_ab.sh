#!/usr/bin/env bash
# A/B runs of the fused decode kernel's compile-time knob (copies of the 4-bit key code-byte table,
# KVCOMPACT_DECODE_KEY_COPIES): for each value, rebuild tq_decode.cu and the decode benchmark in an existing
# build directory (only that file recompiles) and time the same cases; then restore the source default.
# Usage: BUILD=build-gpu COPIES="8 16 32" CASES="recommended 64 131072,recommended 8 32768" scripts/gpu/decode_ab.sh
# Prints one line per (copies, case); CSV in $OUT/decode_ab.csv.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
COPIES="${COPIES:-8 16 32}"
CASES="${CASES:-recommended 64 131072,recommended 8 32768,recommended 1 131072}"
ARGS=()
IFS=',' read -ra LIST <<< "$CASES"
for c in "${LIST[@]}"; do ARGS+=(--only $c); done
echo "copies,mode,batch,context,us" > "$OUT/decode_ab.csv"
# The source default back in the build directory however the script ends (a build failure, a kill): build
# outputs stay on a warm machine, and a later run in $BUILD would otherwise measure the last variant.
trap 'cmake "$BUILD" -DKVCOMPACT_DECODE_KEY_COPIES= > /dev/null 2>&1' EXIT
trap 'exit 143' TERM
for r in $COPIES; do
  cmake "$BUILD" -DKVCOMPACT_DECODE_KEY_COPIES="$r" > /dev/null || exit 1
  cmake --build "$BUILD" -j16 --target kvcompact_cuda_bench > "$OUT/decode_ab_build.log" 2>&1 \
    || { grep -E "error" -A3 "$OUT/decode_ab_build.log" | head -20; exit 1; }
  "$BUILD/src/cuda/bench/kvcompact_cuda_bench" "${ARGS[@]}" 2>&1 \
    | awk -v r="$r" '$1 ~ /^(recommended|seed)$/ { printf "copies %-3s %-12s %5s %7s %10s us\n", r, $1, $2, $3, $5;
                                                   printf "%s,%s,%s,%s,%s\n", r, $1, $2, $3, $5 >> "'"$OUT/decode_ab.csv"'" }'
done
