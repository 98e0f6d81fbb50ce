#!/usr/bin/env python3
"""Per case and side of an A/B CSV (columns round, side, the key columns, the value column): the mean value over
the rounds and its ratio to side "base". Used by prefill_ab.sh, encode_ab.sh, tq_decode_ab.sh, tq_step_ab.sh,
dsv4_flags_ab.sh and dsv4_ab.sh's prefill chunks.
Usage: ab_table.py CSV KEY_COLUMNS VALUE_COLUMN      (KEY_COLUMNS comma-separated, e.g. mode,precision,context)"""
import collections
import csv
import sys


def main():
    path, keys, value = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    rows = list(csv.DictReader(open(path)))
    sides = list(dict.fromkeys(r["side"] for r in rows))
    acc = collections.defaultdict(list)
    for r in rows:
        acc[tuple(r[k] for k in keys) + (r["side"],)].append(float(r[value]))
    cases = list(dict.fromkeys(tuple(r[k] for k in keys) for r in rows))
    width = [max([len(k)] + [len(c[i]) for c in cases]) for i, k in enumerate(keys)]
    side_width = max([4] + [len(s) for s in sides])
    print(" ".join(k.ljust(w) for k, w in zip(keys, width)), "side".ljust(side_width), f"{value:>10}", f"{'/base':>7}")
    mean = lambda v: sum(v) / len(v)
    for c in cases:
        base = acc.get(c + ("base",))
        for s in sides:
            v = acc.get(c + (s,))
            if not v:
                continue
            ratio = f"{mean(v) / mean(base):7.3f}" if base else "      -"
            print(" ".join(x.ljust(w) for x, w in zip(c, width)), s.ljust(side_width), f"{mean(v):10.1f}", ratio)


if __name__ == "__main__":
    main()
