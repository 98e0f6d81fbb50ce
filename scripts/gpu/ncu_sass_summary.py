#!/usr/bin/env python3
"""Where a kernel's time goes, from Nsight Compute's per-instruction SASS page (the *_sass.csv.gz that the profile
scripts keep): the stall reasons over all samples, the opcodes by executed instructions beside their share of the
samples, and the code in windows of consecutive instructions (share of samples and of executed instructions, with
the memory, barrier and collective opcodes each window holds), which finds the loop or phase that holds the time
when the report has no source lines.

Usage: scripts/gpu/ncu_sass_summary.py FILE [--window N] [--top K]     (FILE: .csv or .csv.gz; - for stdin)
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_sass_csv  # noqa: E402

MARKERS = ("LDG", "STG", "LDS", "STS", "LDGSTS", "ATOMS", "ATOM", "RED", "REDUX", "SHFL", "VOTE", "BAR", "SYNCS",
           "UCGABAR_ARV", "UCGABAR_WAIT", "HGMMA", "HMMA", "IMMA", "UBLKCP", "UTMALDG", "MEMBAR", "CALL")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--window", type=int, default=48, help="instructions per window (default 48)")
    parser.add_argument("--top", type=int, default=20, help="opcodes listed (default 20)")
    args = parser.parse_args()
    header, rows = ncu_sass_csv.read(None if args.file == "-" else args.file)
    number = ncu_sass_csv.number
    samples = ncu_sass_csv.column(header, "Warp Stall Sampling (All")
    executed = header.index("Instructions Executed") if "Instructions Executed" in header else None
    source = header.index("Source")
    if samples is None or executed is None:
        sys.exit("need the 'Warp Stall Sampling (All Samples)' and 'Instructions Executed' columns")
    reasons = [i for i, name in enumerate(header) if name.startswith("stall_") and "(Not Issued)" not in name]

    total_samples = sum(number(r[samples]) for r in rows) or 1.0
    total_executed = sum(number(r[executed]) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total_samples:.0f} samples, {total_executed:.0f} warp instructions executed")

    print("\nstall reasons (all samples)")
    by_reason = collections.Counter()
    for r in rows:
        for i in reasons:
            by_reason[header[i]] += number(r[i])
    reason_total = sum(by_reason.values()) or 1.0
    for name, value in by_reason.most_common(12):
        print(f"  {name:26} {100 * value / reason_total:5.1f} %")

    print(f"\nopcodes: executed share, sample share (top {args.top})")
    run, sampled = collections.Counter(), collections.Counter()
    for r in rows:
        op = ncu_sass_csv.opcode(r[source])
        run[op] += number(r[executed])
        sampled[op] += number(r[samples])
    for op, value in run.most_common(args.top):
        print(f"  {op:14} {100 * value / total_executed:5.1f} %  {100 * sampled[op] / total_samples:5.1f} %")

    print(f"\nwindows of {args.window} instructions: first address, samples, executed, what they hold")
    for start in range(0, len(rows), args.window):
        window = rows[start:start + args.window]
        s = sum(number(r[samples]) for r in window)
        e = sum(number(r[executed]) for r in window)
        held = sorted({ncu_sass_csv.opcode(r[source]) for r in window} & set(MARKERS))
        first = window[0][header.index("Address")] if "Address" in header else str(start)
        print(f"  {start:5d} {first:>18} {100 * s / total_samples:5.1f} % {100 * e / total_executed:5.1f} %  "
              f"{' '.join(held)}")


if __name__ == "__main__":
    main()
