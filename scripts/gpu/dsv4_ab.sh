#!/usr/bin/env bash
# A/B of the DeepSeek-V4 decode step on the GPU machine, every side measured in the same run: the working tree
# ("new") against the revisions exported by scripts/gpu/dsv4_ab_prepare.sh ("base" in .ab/base, and any further
# ones in .ab/<name>, listed in .ab/sides). Builds the decode benchmark of each side, runs the DeepSeek-V4 GPU
# tests and compute-sanitizer memcheck / racecheck on their Small suite on every side but base (TESTS=0 skips
# them; a side that fails them is still measured, and the script exits nonzero), then runs every case on every
# side, alternating, ROUNDS times (run-to-run drift of the card then hits all sides alike), and prints per case
# and side the mean step time (CUDA graph), its indexer / attention parts, and side / base. CSV of every run in
# $OUT/dsv4_ab.csv; the logs packed in $OUT/ab_logs.tgz. TEST_SIDES="new other-side" limits the tests and
# sanitizers to the sides named (default: every side but base): a side measured only to explain a result then
# costs no device time for them and needs no test binary (built or carried) — and cannot be landed on this run's
# word.
# Usage: [PREFILL_STORAGES="fp8 bf16"] CASES="bf16 1 1048576,bf16 8 1048576" scripts/gpu/dsv4_ab.sh [ROUNDS]   (default 2 rounds)
#        (a case may end in benchmark flags: "fp8 1 1048576 --distinct-indexer-rows", reported as storage fp8/distinct)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/ab_common.sh
CASES="${CASES:-bf16 1 65536,bf16 1 1048576,fp8 1 262144,bf16 8 1048576}"
ROUNDS="${1:-2}"
BENCH_TARGET=kvcompact_cuda_dsv4_decode_bench
BENCH_PATH=src/cuda/bench/kvcompact_cuda_dsv4_decode_bench
TESTS_TARGET=kvcompact_cuda_dsv4_tests
ab_sides
rc=0
if [ "${TESTS:-1}" = 1 ]; then
  if [ -n "${TEST_SIDES+set}" ]; then
    # Only the sides whose tests run need (or, prebuilt, must carry) the test binary.
    for s in "${SIDES[@]}"; do
      SIDE_TARGETS[$s]=$BENCH_TARGET
      [[ " $TEST_SIDES " == *" $s "* ]] && SIDE_TARGETS[$s]="$BENCH_TARGET $TESTS_TARGET"
    done
  fi
  ab_build "$BENCH_TARGET $TESTS_TARGET" "$BENCH_TARGET" "$BENCH_TARGET $TESTS_TARGET"
  for s in "${SIDES[@]}"; do
    if [ -n "${TEST_SIDES+set}" ]; then
      [[ " $TEST_SIDES " == *" $s "* ]] || { echo "side $s: tests and sanitizers skipped (TEST_SIDES)"; continue; }
    else
      [ "$s" = base ] && continue
    fi
    ab_check "dsv4_$s" '*' '*Small*' '^\[dsv4-kernels\] indexer' 300 "${DIR[$s]}/build-gpu/tests/cuda_dsv4/$TESTS_TARGET"
    [ "$rc" != 0 ] || rc=$CHECK_RC
    # A side whose tests hung would hang its benchmark too: it is not measured.
    if [ "$CHECK_RC" = 124 ]; then
      echo "side $s: tests timed out, so it is not benchmarked"
      HUNG="${HUNG:-} $s"
    fi
  done
else
  ab_build "$BENCH_TARGET" "$BENCH_TARGET"
fi
echo "round,side,storage,batch,context,us,graph_us,indexer_us,attention_us" > "$OUT/dsv4_ab.csv"
IFS=',' read -ra LIST <<< "$CASES"
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SIDES[@]}"; do
    [[ " ${HUNG:-} " == *" $s "* ]] && continue
    for c in "${LIST[@]}"; do
      # The benchmark's last line for --only: storage batch context us graph_us index_us attn_us bytes floor ratio.
      # (A case takes seconds; BENCH_TIMEOUT bounds a hang within the device's 600 s per command.)
      line=$(timeout "${BENCH_TIMEOUT:-90}" "${DIR[$s]}/build-gpu/$BENCH_PATH" --only $c 2>&1 | tail -1)
      read -r st b ctx us graph idx attn _ <<< "$line"
      if ! [[ "$graph" =~ ^[0-9.]+$ ]]; then
        echo "error: $s $c: $line" >&2
        (cd "$OUT" && pack_out ab_logs ab_build_*.log dsv4_*_tests.log dsv4_*_memcheck.log dsv4_*_racecheck.log)
        exit 1
      fi
      [[ "$line" == *scalar-path* ]] && echo "warning: $s $c took the scalar path: $line" >&2
      # (A case may add benchmark flags after its context; they are told apart in the storage column:
      # --distinct-indexer-rows as "/distinct", any other flags as themselves without dashes and spaces.)
      read -r _ _ _ extra <<< "$c"
      if [ -n "$extra" ]; then
        [[ "$extra" == *--distinct-indexer-rows* ]] && st="$st/distinct"
        extra=${extra//--distinct-indexer-rows/}
        extra=$(echo "$extra" | tr -d ' -')
        [ -z "$extra" ] || st="$st/$extra"
      fi
      echo "$r,$s,$st,$b,$ctx,$us,$graph,$idx,$attn" >> "$OUT/dsv4_ab.csv"
    done
  done
done
python3 - "$OUT/dsv4_ab.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
sides = list(dict.fromkeys(r["side"] for r in rows))
acc = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    key = (r["storage"], r["batch"], r["context"])
    for f in ("graph_us", "indexer_us", "attention_us"):
        acc[key][(r["side"], f)].append(float(r[f]))
mean = lambda v: sum(v) / len(v)
print(f"{'storage':<10} {'batch':>5} {'context':>8} {'side':<24} {'us':>9} {'/base':>7} {'indexer':>9} {'attention':>9}")
for (st, b, ctx), a in acc.items():
    base = mean(a[("base", "graph_us")]) if a[("base", "graph_us")] else 0.0
    for s in sides:
        if not a[(s, "graph_us")]:
            continue
        us = mean(a[(s, "graph_us")])
        print(f"{st:<10} {b:>5} {ctx:>8} {s:<24} {us:9.1f} {us / base if base > 0 else float('nan'):7.3f} "
              f"{mean(a[(s, 'indexer_us')]):9.1f} {mean(a[(s, 'attention_us')]):9.1f}")
PY
# PREFILL_STORAGES="fp8 bf16": then each storage's 4096-token prefill chunk (--prefill-only), every side,
# alternating, ROUNDS times; mean microseconds per side and side / base (CSV $OUT/dsv4_prefill_ab.csv).
if [ -n "${PREFILL_STORAGES:-}" ]; then
  echo "round,side,storage,us,indexer_us,attention_us" > "$OUT/dsv4_prefill_ab.csv"
  for r in $(seq 1 "$ROUNDS"); do
    for s in "${SIDES[@]}"; do
      [[ " ${HUNG:-} " == *" $s "* ]] && continue
      for st in $PREFILL_STORAGES; do
        # "<storage> prefill 4096 tokens: <us> us (indexer <us>, attention <us>), <n> tokens/s"
        line=$(timeout "${BENCH_TIMEOUT:-90}" "${DIR[$s]}/build-gpu/$BENCH_PATH" --only "$st" 1 65536 --prefill-only 2>&1 |
               grep ' prefill 4096 tokens:' | tail -1)
        nums=$(echo "$line" | sed -E 's/.*tokens: ([0-9.]+) us \(indexer ([0-9.]+), attention ([0-9.]+)\).*/\1,\2,\3/')
        if ! [[ "$nums" =~ ^[0-9.]+,[0-9.]+,[0-9.]+$ ]]; then
          echo "error: $s prefill $st: $line" >&2
          rc=1
          continue
        fi
        echo "$r,$s,$st,$nums" >> "$OUT/dsv4_prefill_ab.csv"
      done
    done
  done
  python3 scripts/gpu/ab_table.py "$OUT/dsv4_prefill_ab.csv" storage us
fi
# The per-side build, test and sanitizer logs as one file (ab_logs.tgz), beside dsv4_ab.csv.
(cd "$OUT" && pack_out ab_logs ab_build_*.log dsv4_*_tests.log dsv4_*_memcheck.log dsv4_*_racecheck.log)
exit "$rc"
