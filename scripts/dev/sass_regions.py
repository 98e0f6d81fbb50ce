#!/usr/bin/env python3
"""Splits a kernel's Nsight Compute stall samples into prologue, main loop and epilogue, with the largest stall
reasons of each. Input: the per-instruction source page that scripts/gpu/ncu_summary.sh writes beside a report
(REPORT_sass.csv; scripts/gpu/profile_decode.sh returns it as decode_sass.csv).

The main loop is taken to run from the last mbarrier wait (SYNCS.PHASECHK) before the first tensor-core
instruction (HMMA / HGMMA) to the last one; the prologue is everything above it, the epilogue everything below
(for the fused decode kernel that includes the in-kernel merge). docs/tq-decode-history.md, round 8, quotes these
shares for the decode kernel at recommended 1 x 32K.

Usage: sass_regions.py REPORT_sass.csv[.gz] [--top N]"""
import argparse
import csv
import gzip
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # Line 1 names the kernel, line 2 holds the column names.
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[header_at]
    out = []
    for r in rows[header_at + 1:]:
        try:
            out.append((int(r[0], 16), r))
        except (ValueError, IndexError):
            continue
    out.sort(key=lambda x: x[0])
    return header, [r for _, r in out]


def opcode(source):
    parts = source.split()
    if not parts:
        return ""
    return (parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]).split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=8, help="stall reasons shown per region")
    args = ap.parse_args()
    header, rows = read_rows(args.csv)
    src = header.index("Source")
    samples = header.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    ops = [opcode(r[src]) for r in rows]
    mma = [i for i, o in enumerate(ops) if o in ("HMMA", "HGMMA")]
    if not mma:
        sys.exit("no tensor-core instruction: no main loop to find")
    waits = [i for i in range(mma[0]) if "SYNCS.PHASECHK" in rows[i][src]]
    loop_begin = waits[-1] if waits else mma[0]
    loop_end = mma[-1] + 1
    total = sum(int(r[samples] or 0) for r in rows)
    print(f"{len(rows)} instructions, {total} samples; main loop = instructions {loop_begin}..{loop_end - 1}")
    for name, lo, hi in (("prologue", 0, loop_begin), ("main loop", loop_begin, loop_end),
                         ("epilogue", loop_end, len(rows))):
        n = sum(int(r[samples] or 0) for r in rows[lo:hi])
        by_reason = {}
        for r in rows[lo:hi]:
            for i in reasons:
                if r[i] not in ("", "0"):
                    key = header[i][len("stall_"):]
                    by_reason[key] = by_reason.get(key, 0) + int(r[i])
        top = sorted(by_reason.items(), key=lambda kv: -kv[1])[: args.top]
        share = 100.0 * n / total if total else 0.0
        print(f"{name:10s} {n:6d} samples {share:5.1f} %   " + ", ".join(f"{k} {v}" for k, v in top))


if __name__ == "__main__":
    main()
