#!/usr/bin/env python3
"""Instructions per warp step of the fast encode kernel, from the per-instruction page of an Nsight Compute report
(scripts/gpu/profile_encode.sh writes it as encode_sass.csv): executed instructions / warp steps, split by how often
each instruction ran per step (1.0 = the common loop body, 0.5 = a per-kind tail when keys and values alternate,
small fractions = the prologue and the rare paths), and by opcode.

Usage: encode_step_mix.py encode_sass.csv STEPS [--top N]
STEPS = warp steps of the profiled launch: rows x kv_heads x 2 kinds / rows per step (32·32/head_dim), e.g. the
quick benchmark's recommended case, 8192 rows x 8 heads x 2 / 8 = 16384."""
import argparse
import collections
import csv


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("steps", type=float)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[header_at]
    executed, source = header.index("Instructions Executed"), header.index("Source")
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    per_step = [(number(r[executed]) / args.steps, r[source].split()) for r in body]
    total = sum(c for c, _ in per_step)
    print(f"{total:.1f} instructions per warp step")
    by_rate = collections.defaultdict(lambda: [0, 0.0])
    for c, _ in per_step:
        if c > 0:
            key = round(c, 3)
            by_rate[key][0] += 1
            by_rate[key][1] += c
    print("runs per step  instructions  per step")
    for rate, (n, c) in sorted(by_rate.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"{rate:12.3f}  {n:12d}  {c:8.1f}")
    opcodes = collections.Counter()
    for c, words in per_step:
        words = [w for w in words if not w.startswith("@")]
        if words:
            opcodes[words[0].split(".")[0]] += c
    print("opcode        per step")
    for op, c in opcodes.most_common(args.top):
        print(f"{op:12s} {c:8.1f}")


if __name__ == "__main__":
    main()
