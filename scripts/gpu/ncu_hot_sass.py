#!/usr/bin/env python3
"""Print the SASS instructions with the most warp-stall samples from `ncu --page source --csv` output.

Usage: ncu --import REPORT --page source --csv --print-source sass | scripts/gpu/ncu_hot_sass.py [TOP]
Prints the header it found (so a changed ncu column name shows at once), then the TOP (default 40)
instructions by all stall samples, each with its share of the kernel's samples, its not-issued samples and,
where ncu gives them, the largest stall reasons of that instruction.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_sass_csv import number, read  # noqa: E402


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    header, body = read()
    print("columns:", ", ".join(header))
    samples = next((header.index(c) for c in header if c.startswith("Warp Stall Sampling (All")), None)
    not_issued = next((header.index(c) for c in header if c.startswith("Warp Stall Sampling (Not")), None)
    if samples is None:
        sys.exit("no 'Warp Stall Sampling (All Samples)' column")
    source = header.index("Source")
    address = header.index("Address") if "Address" in header else None
    reasons = [i for i, c in enumerate(header) if c.startswith("stall_") or c.startswith("smsp__pcsamp_warps_issue_stalled")]
    total = sum(number(row[samples]) for row in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples")
    for position, row in enumerate(sorted(body, key=lambda r: -number(r[samples]))[:top]):
        share = 100.0 * number(row[samples]) / total
        where = row[address] if address is not None else str(position)
        idle = f" not-issued {number(row[not_issued]):.0f}" if not_issued is not None else ""
        largest = sorted(((number(row[i]), header[i]) for i in reasons), reverse=True)[:3]
        why = "  " + ", ".join(f"{name}={value:.0f}" for value, name in largest if value > 0) if largest else ""
        print(f"{share:5.1f}%  {where:>8}  {row[source][:70]:70}{idle}{why}")


if __name__ == "__main__":
    main()
