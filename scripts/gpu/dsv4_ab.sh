#!/usr/bin/env bash
# A/B of the DeepSeek-V4 decode step on the GPU machine, both sides measured in the same run: the working tree
# ("new") against the revision exported by scripts/gpu/dsv4_ab_prepare.sh ("base", in .ab/base). Builds the
# decode benchmark of both, then runs every case on both sides, alternating, ROUNDS times (run-to-run drift of
# the card then hits both sides alike), and prints per case the mean step time (CUDA graph) and its indexer /
# attention parts, and new / base. CSV of every run in $OUT/dsv4_ab.csv.
# Usage: CASES="bf16 1 1048576,bf16 8 1048576" scripts/gpu/dsv4_ab.sh [ROUNDS]   (default 2 rounds)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
ROUNDS="${1:-2}"
CASES="${CASES:-bf16 1 65536,bf16 1 1048576,fp8 1 262144,bf16 8 1048576}"
if [ ! -f .ab/base/CMakeLists.txt ]; then
  echo "error: no .ab/base: run scripts/gpu/dsv4_ab_prepare.sh REV first and carry .ab to this machine" >&2
  exit 2
fi
source scripts/gpu/configure.sh
BENCH_TARGET=kvcompact_cuda_dsv4_decode_bench
BENCH_PATH=src/cuda/bench/kvcompact_cuda_dsv4_decode_bench
t0=$(date +%s)
gpu_configure build-gpu "$OUT/ab_build_new.log" && cmake --build build-gpu -j16 --target "$BENCH_TARGET" >> "$OUT/ab_build_new.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/ab_build_new.log" | head -30; exit 1; }
# The base tree uses this tree's carried dependencies (.deps) through a link.
[ -d .deps ] && [ ! -e .ab/base/.deps ] && ln -s "$PWD/.deps" .ab/base/.deps
(cd .ab/base && gpu_configure build-gpu "$OUT/ab_build_base.log" && cmake --build build-gpu -j16 --target "$BENCH_TARGET" >> "$OUT/ab_build_base.log" 2>&1) \
  || { grep -E "error" -A3 "$OUT/ab_build_base.log" | head -30; exit 1; }
echo "built both sides in $(( $(date +%s) - t0 )) s; base = $(cat .ab/base_rev 2>/dev/null || echo '?')"
declare -A BIN=([new]="build-gpu/$BENCH_PATH" [base]=".ab/base/build-gpu/$BENCH_PATH")
echo "round,side,storage,batch,context,us,graph_us,indexer_us,attention_us" > "$OUT/dsv4_ab.csv"
IFS=',' read -ra LIST <<< "$CASES"
for r in $(seq 1 "$ROUNDS"); do
  for side in new base; do
    for c in "${LIST[@]}"; do
      # The benchmark's last line for --only: storage batch context us graph_us index_us attn_us bytes floor ratio.
      line=$("${BIN[$side]}" --only $c 2>&1 | tail -1)
      read -r st b ctx us graph idx attn _ <<< "$line"
      if ! [[ "$graph" =~ ^[0-9.]+$ ]]; then
        echo "error: $side $c: $line" >&2
        exit 1
      fi
      echo "$r,$side,$st,$b,$ctx,$us,$graph,$idx,$attn" >> "$OUT/dsv4_ab.csv"
    done
  done
done
python3 - "$OUT/dsv4_ab.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
acc = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    key = (r["storage"], r["batch"], r["context"])
    for f in ("graph_us", "indexer_us", "attention_us"):
        acc[key][(r["side"], f)].append(float(r[f]))
mean = lambda v: sum(v) / len(v)
print(f"{'storage':<10} {'batch':>5} {'context':>8} {'base us':>9} {'new us':>9} {'new/base':>8}  "
      f"{'base idx':>9} {'new idx':>9} {'base attn':>9} {'new attn':>9}")
for (st, b, ctx), a in acc.items():
    bu, nu = mean(a[("base", "graph_us")]), mean(a[("new", "graph_us")])
    print(f"{st:<10} {b:>5} {ctx:>8} {bu:9.1f} {nu:9.1f} {nu / bu:8.3f}  "
          f"{mean(a[('base', 'indexer_us')]):9.1f} {mean(a[('new', 'indexer_us')]):9.1f} "
          f"{mean(a[('base', 'attention_us')]):9.1f} {mean(a[('new', 'attention_us')]):9.1f}")
PY
