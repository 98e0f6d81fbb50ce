#!/usr/bin/env bash
# A/B of benchmark flags on one DeepSeek-V4 decode benchmark binary, in one run on the GPU machine: every case
# under every flag set, alternating, ROUNDS times; prints per case and flag set (its "side"; the empty set is
# "base") the mean step time (CUDA graph), its indexer and attention parts, each against base
# (scripts/gpu/ab_table.py). CSV of every run in $OUT/dsv4_flags_ab.csv.
# For changes that live behind a benchmark flag (e.g. --price-without-prepare, or round 35's --l2-prefetch from
# scripts/dev/l2_prefetch_next_layers.patch), where dsv4_ab.sh's sides would each need
# their own build. BIN: the benchmark (default .ab/new/build-gpu/..., as scripts/gpu/ab_prebuild.sh puts it);
# FLAGS: flag sets separated by "|", one of them empty (the baseline).
# Usage: CASES='fp8 1 1048576,bf16 1 1048576' FLAGS='|--price-without-prepare' scripts/gpu/dsv4_flags_ab.sh [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
[ -d .deps/usr ] && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
BIN="${BIN:-.ab/new/build-gpu/src/cuda/bench/kvcompact_cuda_dsv4_decode_bench}"
[ -f "$BIN.gz" ] && [ ! -f "$BIN" ] && gunzip -k "$BIN.gz" && chmod +x "$BIN"
[ -x "$BIN" ] || { echo "error: no benchmark at $BIN" >&2; exit 2; }
ROUNDS="${1:-2}"
IFS=',' read -ra LIST <<< "${CASES:?CASES='storage batch context,...'}"
IFS='|' read -ra SETS <<< "${FLAGS:?FLAGS='|--flag value'}"
csv="$OUT/dsv4_flags_ab.csv"
echo "round,side,storage,batch,context,us,graph_us,indexer_us,attention_us" > "$csv"
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for f in "${SETS[@]}"; do
    for c in "${LIST[@]}"; do
      # The benchmark's last line for --only: storage batch context us graph_us index_us attn_us bytes floor ratio.
      line=$(timeout "${BENCH_TIMEOUT:-90}" "$BIN" --only $c $f 2>&1 | tail -1)
      read -r st b ctx us graph idx attn _ <<< "$line"
      if ! [[ "$graph" =~ ^[0-9.]+$ ]]; then
        echo "error: [$f] $c: $line" >&2
        rc=1
        continue
      fi
      side=${f:-base}
      echo "$r,\"$side\",$st,$b,$ctx,$us,$graph,$idx,$attn" >> "$csv"
    done
  done
done
# (The empty flag set is side "base" of the table; every value column against it.)
for v in graph_us indexer_us attention_us; do python3 scripts/gpu/ab_table.py "$csv" storage,batch,context "$v"; done
exit "$rc"
