#!/usr/bin/env bash
# DeepSeek-V4-Flash decode step on the GPU: ours (kvcompact_cuda_dsv4_decode_bench: indexer + top-k + sparse
# attention through all 43 layers, 64K / 256K / 1M context, batch 1 / 8, bf16 / fp8 / fp8+mxfp4 storage, plus a
# 4096-token prefill chunk) and the straightforward torch implementation (scripts/gpu/dsv4_torch_baseline.py)
# in the same run. Writes $OUT/dsv4_decode.csv (one row per case) and prints the joined table.
# Env: BUILD (build dir), OUT (results dir), QUICK (--quick: 64K and 1M only, fewer repetitions).
set -uo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${BUILD:-build-gpu}"
OUT="${OUT:-$PWD/out}"
QUICK="${QUICK:-}"
mkdir -p "$OUT"
BIN="$BUILD/src/cuda/bench/kvcompact_cuda_dsv4_decode_bench"
TMP="$(mktemp -d)"
if [ ! -x "$BIN" ]; then echo "dsv4_decode: $BIN not built"; exit 1; fi
t0=$(date +%s)
timeout 65 "$BIN" $QUICK --csv "$TMP/ours.csv" > "$OUT/dsv4_decode_bench.log" 2>&1
echo "ours: exit $? in $(( $(date +%s) - t0 )) s (log: dsv4_decode_bench.log)"
grep -E "^(device|model|copy)|scalar-path|prefill 4096" "$OUT/dsv4_decode_bench.log"
t1=$(date +%s)
PYTHONUNBUFFERED=1 timeout 22 python3 scripts/gpu/dsv4_torch_baseline.py $QUICK --csv "$TMP/torch.csv" \
  > "$OUT/dsv4_torch.log" 2>&1
echo "torch: exit $? in $(( $(date +%s) - t1 )) s (log: dsv4_torch.log)"
python3 - "$TMP/ours.csv" "$TMP/torch.csv" "$OUT/dsv4_decode.csv" <<'PY'
import csv, math, os, sys
ours_p, torch_p, out_p = sys.argv[1:4]
ours = list(csv.DictReader(open(ours_p))) if os.path.exists(ours_p) else []
torch_rows = {}
if os.path.exists(torch_p):
    for r in csv.DictReader(open(torch_p)):
        torch_rows[(r["storage"], r["batch"], r["context"])] = float(r["torch_us"])
cols = ["kind", "storage", "batch", "context", "ours_us", "graph_us", "indexer_us", "attention_us", "bytes",
        "floor_us", "ratio", "torch_us", "speedup"]
with open(out_p, "w") as f:
    w = csv.writer(f)
    w.writerow(cols)
    print(f"{'storage':<10} {'batch':>5} {'context':>8} {'ours_us':>9} {'floor_us':>9} {'ratio':>6} {'torch_us':>10} {'speedup':>8}")
    for r in ours:
        if r["kind"] == "copy":
            continue
        best = float(r["us"])
        g = float(r["graph_us"])
        if g > 0:
            best = min(best, g)
        # The torch baseline has no MXFP4: fp8+mxfp4 is compared with torch's fp8 storage.
        tkey = ("fp8" if r["storage"].startswith("fp8") else r["storage"], r["batch"], r["context"])
        t = torch_rows.get(tkey, float("nan")) if r["kind"] == "decode" else float("nan")
        sp = t / best if best > 0 and not math.isnan(t) else float("nan")
        w.writerow([r["kind"], r["storage"], r["batch"], r["context"], f"{best:.2f}", r["graph_us"], r["indexer_us"],
                    r["attention_us"], r["bytes"], r["floor_us"], r["ratio"], f"{t:.2f}", f"{sp:.2f}"])
        if r["kind"] == "decode":
            print(f"{r['storage']:<10} {r['batch']:>5} {r['context']:>8} {best:>9.1f} {float(r['floor_us']):>9.1f} "
                  f"{float(r['ratio']):>6.2f} {t:>10.1f} {sp:>8.2f}")
PY
rm -rf "$TMP"
