#!/usr/bin/env bash
# Step of scripts/gpu/run_all.sh: an end-to-end decode step through the GPU-resident TurboQuant cache
# (DeviceCache: append every sequence's token, then decode, per layer; 8 Llama-3-8B layers) — appends one by one,
# append_batch (one wait per layer), append_deferred (one wait per step), the whole step replayed from a CUDA
# graph (append_at_length; with and without sync_lengths per step) and decode alone. Env: BUILD (build dir),
# OUT (results dir), QUICK ("--quick" or empty). Writes $OUT/tq_step.csv and prints the table; the
# benchmark runs under a timeout (step < 150 s).
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
QUICK="${QUICK:-}"
mkdir -p "$OUT"
BIN="$BUILD/src/cuda/bench/kvcompact_cuda_tq_step_bench"
if [ ! -x "$BIN" ]; then
  echo "missing $BIN (not built?)"
  exit 0
fi
timeout -k 5 140 "$BIN" $QUICK --csv "$OUT/tq_step.csv" > "$OUT/tq_step_bench.log" 2>&1
echo "step bench exit code: $? (124 = timed out)"
grep -vE "^$" "$OUT/tq_step_bench.log" | head -20
