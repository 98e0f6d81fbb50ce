#!/usr/bin/env bash
# Step of scripts/gpu/run_all.sh: CUDA chunked-prefill attention (2048-token chunk over 8K / 32K / 128K cached
# tokens, Llama-3-8B heads, recommended and seed modes, P precision hilo and fast; the recommended mode on both the
# warpgroup and the portable kernel) against torch SDPA bf16 on
# the same causal (bottom-right aligned) chunk. Env: BUILD (build dir), OUT (results dir), QUICK ("--quick" or
# empty). Writes $OUT/tq_prefill.csv and prints a short table. Every command runs under a timeout, so the step
# ends within ~105 s whatever happens.
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
QUICK="${QUICK:-}"
mkdir -p "$OUT"
BIN="$BUILD/src/cuda/bench/kvcompact_cuda_tq_prefill_bench"
OURS="$OUT/tq_prefill_ours.csv.tmp"
BASE="$OUT/tq_prefill_sdpa.csv.tmp"
rm -f "$OURS" "$BASE"
if [ -x "$BIN" ]; then
  timeout -k 3 45 "$BIN" $QUICK --csv "$OURS" > "$OUT/tq_prefill_bench.log" 2>&1
  echo "prefill bench exit code: $? (124 = timed out)"
  grep -vE "^$" "$OUT/tq_prefill_bench.log" | head -24
else
  echo "missing $BIN (not built?)"
fi
PYTHONUNBUFFERED=1 timeout -k 3 40 python3 scripts/gpu/sdpa_prefill_baseline.py $QUICK --budget-s 25 --csv "$BASE" \
  > "$OUT/tq_prefill_sdpa.log" 2>&1
echo "sdpa baseline exit code: $? (124 = timed out)"
grep -E "^torch|^sdpa|budget" "$OUT/tq_prefill_sdpa.log" | head -30
echo "sdpa variants a backend refused: $(grep -c unavailable "$OUT/tq_prefill_sdpa.log") (details in tq_prefill_sdpa.log)"
timeout -k 2 8 python3 - "$OURS" "$BASE" "$OUT/tq_prefill.csv" <<'PY'
import csv, os, sys
ours_path, base_path, out_path = sys.argv[1:4]
def read(p):
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return list(csv.DictReader(f))
ours, base = read(ours_path), read(base_path)
best = {}
for r in base:
    if r.get("ok") != "1":
        continue
    ctx = int(r["context"])
    if ctx not in best or float(r["us"]) < float(best[ctx]["us"]):
        best[ctx] = r
rows = []
print(f"{'mode':12s} {'prec':5s} {'kernel':10s} {'context':>7s} {'ours us':>10s} {'TFLOP/s':>8s} {'bf16 best':>22s} {'bf16 us':>10s} {'TFLOP/s':>8s} {'ours/bf16':>9s}")
for r in ours:
    ctx = int(r["context"])
    b = best.get(ctx)
    ratio = float(b["us"]) / float(r["us"]) if b else float("nan")
    print(f"{r['mode']:12s} {r['precision']:5s} {r['kernel']:10s} {ctx:7d} {float(r['us']):10.1f} {float(r['tflops']):8.1f} "
          f"{(b['backend'] if b else '-'):>22s} {(float(b['us']) if b else float('nan')):10.1f} "
          f"{(float(b['tflops']) if b else float('nan')):8.1f} {ratio:9.2f}")
    rows.append(["ours", r["mode"], r["precision"], r["kernel"], ctx, r["chunk"], r["us"], r["tflops"],
                 b["backend"] if b else "", b["us"] if b else "", f"{ratio:.3f}"])
for r in base:
    rows.append(["sdpa_bf16", r["backend"], "bf16", "", r["context"], r["chunk"], r["us"], r["tflops"],
                 "ok" if r.get("ok") == "1" else "mask_check_failed", "", ""])
with open(out_path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["kind", "mode_or_backend", "precision", "kernel", "context", "chunk", "us", "tflops", "bf16_best_backend",
                "bf16_best_us", "throughput_ratio_ours_over_bf16"])
    w.writerows(rows)
print(f"wrote {out_path} ({len(rows)} rows); ratio = bf16-best time / our time (>= 0.5 is the target)")
PY
rm -f "$OURS" "$BASE"
