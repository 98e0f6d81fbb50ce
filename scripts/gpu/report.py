#!/usr/bin/env python3
"""Joins the kvcompact CUDA benchmark CSV with the torch SDPA baseline CSV of the same run and prints the
decode table (µs, bytes read, GB/s, % of the measured copy bandwidth, speedup vs the best bf16 backend, the
target 0.7 × bf16 bytes / compressed bytes) and writes it as CSV."""
import csv
import sys


def main(tq_csv, sdpa_csv, out_csv):
    tq = list(csv.DictReader(open(tq_csv)))
    sd = list(csv.DictReader(open(sdpa_csv)))
    copy = float(next(r for r in tq if r["kind"] == "copy")["gbps"])
    copy_torch = float(next(r for r in sd if r["kind"] == "copy")["gbps"])
    best = {}
    for r in sd:
        if r["kind"] != "sdpa":
            continue
        key = (int(r["batch"]), int(r["context"]))
        us = float(r["us"])
        best.setdefault(key, {})[r["backend"]] = us
    print(f"\ncopy bandwidth: {copy:.0f} GB/s (kvcompact bench), {copy_torch:.0f} GB/s (torch)")
    hdr = ["mode", "batch", "context", "us", "bytes", "GBps", "pct_copy", "cudnn_us", "flash_us",
           "speedup_vs_best_bf16", "bytes_ratio", "target_speedup", "meets_speedup", "meets_70pct_bw"]
    print(f"{'mode':12s} {'batch':>5s} {'ctx':>7s} {'us':>9s} {'GB/s':>7s} {'%copy':>6s} {'cudnn':>9s} "
          f"{'flash':>9s} {'speedup':>8s} {'target':>7s}")
    out = []
    for r in tq:
        if r["kind"] != "decode":
            continue
        b, ctx, us = int(r["batch"]), int(r["context"]), float(r["us"])
        gbps = float(r["gbps"])
        base = best.get((b, ctx), {})
        cud, fla = base.get("cudnn"), base.get("flash")
        cands = [x for x in (cud, fla) if x is not None]
        bestus = min(cands) if cands else None
        speed = bestus / us if bestus else float("nan")
        ratio = int(r["bf16_bytes"]) / int(r["bytes"])
        target = 0.7 * ratio
        meets = "yes" if bestus and speed >= target else "no"
        bw = "yes" if gbps >= 0.7 * copy else "no"
        print(f"{r['mode']:12s} {b:5d} {ctx:7d} {us:9.1f} {gbps:7.0f} {100 * gbps / copy:5.1f}% "
              f"{cud if cud else float('nan'):9.1f} {fla if fla else float('nan'):9.1f} {speed:7.2f}x {target:6.2f}x")
        out.append([r["mode"], b, ctx, us, r["bytes"], gbps, 100 * gbps / copy, cud, fla, speed, ratio, target,
                    meets, bw])
    for r in tq:
        if r["kind"] == "encode":
            g = float(r["gbps"])
            print(f"encode {r['mode']:12s} {r['context']} tokens x 8 heads: {float(r['us']):.1f} us, {g:.0f} GB/s "
                  f"({100 * g / copy:.1f}% of copy)")
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(hdr)
        w.writerows(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
