#!/usr/bin/env bash
# A/B of benchmark flags on one DeepSeek-V4 decode benchmark binary, in one run on the GPU machine: every case
# under every flag set, alternating, ROUNDS times; prints per case and flag set the mean step time (CUDA graph),
# its indexer / attention parts and the ratio to the first flag set. CSV of every run in $OUT/dsv4_flags_ab.csv.
# For changes that live behind a benchmark flag (e.g. --l2-prefetch), where dsv4_ab.sh's sides would each need
# their own build. BIN: the benchmark (default .ab/new/build-gpu/..., as scripts/gpu/ab_prebuild.sh puts it);
# FLAGS: flag sets separated by "|" (an empty set is the baseline; the first set is the reference).
# Usage: CASES='fp8 1 1048576,bf16 1 1048576' FLAGS='|--l2-prefetch 0.6' scripts/gpu/dsv4_flags_ab.sh [ROUNDS]
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
echo "round,flags,storage,batch,context,us,graph_us,indexer_us,attention_us" > "$csv"
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
      echo "$r,\"$f\",$st,$b,$ctx,$us,$graph,$idx,$attn" >> "$csv"
    done
  done
done
python3 - "$csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
sets = list(dict.fromkeys(r["flags"] for r in rows))
acc = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    acc[(r["storage"], r["batch"], r["context"])][r["flags"]].append(
        (float(r["graph_us"]), float(r["indexer_us"]), float(r["attention_us"])))
mean = lambda v: sum(v) / len(v)
print(f"{'storage':<10} {'batch':>5} {'context':>8} {'flags':<44} {'graph_us':>9} {'/first':>7} {'indexer':>9} {'attention':>9}")
for (st, b, ctx), a in acc.items():
    ref = mean([x[0] for x in a[sets[0]]]) if a[sets[0]] else float("nan")
    for f in sets:
        if not a[f]:
            continue
        g = mean([x[0] for x in a[f]])
        print(f"{st:<10} {b:>5} {ctx:>8} {f or '(none)':<44} {g:9.1f} {g / ref:7.3f} "
              f"{mean([x[1] for x in a[f]]):9.1f} {mean([x[2] for x in a[f]]):9.1f}")
PY
exit "$rc"
