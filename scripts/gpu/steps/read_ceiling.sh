#!/usr/bin/env bash
# Step of scripts/gpu/run_all.sh: the read ceiling of the decode table's cases — how fast one launch of a plain
# streaming-read kernel reads each case's compressed bytes (kvcompact_cuda_read_ceiling_bench), as µs and % of the
# copy bandwidth of the same run; no decode of those bytes can beat it, so it bounds what issue 4's "≥ 70 % of
# measured bandwidth" can reach per case. Env: BUILD (build dir), OUT (results dir); QUICK is ignored (all 24
# cases). Writes $OUT/read_ceiling.csv and prints the table.
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
BIN="$BUILD/src/cuda/bench/kvcompact_cuda_read_ceiling_bench"
if [ ! -x "$BIN" ]; then
  echo "missing $BIN (not built?)"
  exit 0
fi
timeout -k 5 80 "$BIN" --csv "$OUT/read_ceiling.csv" > "$OUT/read_ceiling_bench.log" 2>&1
echo "read ceiling bench exit code: $? (124 = timed out)"
grep -vE "^$" "$OUT/read_ceiling_bench.log" | head -30
