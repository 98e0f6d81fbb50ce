#!/usr/bin/env python3
"""The selection arithmetic of scripts/gpu/grid_topk_probe.cu, transcribed to NumPy and checked against a sort.

The probe's kernel picks the top 512 of 262 144 scores in three radix digits of order-preserving 32-bit keys
(11, 11 and 10 bits from the top), stopping early when a boundary bin is taken whole, and breaks ties at the
boundary key by the lowest index. This script runs the same steps on the whole array at once (no blocks or
threads: their partition only orders the tie-break, which is by index here too) for four kinds of scores and
checks each list against sorting by (score descending, index ascending). Needs numpy; a few seconds.
    python3 scripts/dev/grid_topk_select_check.py
"""
import sys

import numpy as np

K = 512
SHIFT = (21, 10, 0)
BITS = (11, 11, 10)


def order_keys(scores):
    """Larger float, larger key (as the kernel's order_key)."""
    u = scores.astype(np.float32).view(np.uint32).astype(np.uint64)
    return np.where(u & 0x80000000, (~u) & 0xFFFFFFFF, u | 0x80000000)


def select(scores):
    keys = order_keys(scores)
    need, prefix, resolved_shift, whole_bin = K, 0, 32, False
    for d in range(3):
        if whole_bin:
            break
        bins = 1 << BITS[d]
        in_boundary = np.ones(len(keys), bool) if resolved_shift == 32 else (keys >> resolved_shift) == prefix
        hist = np.bincount(((keys[in_boundary] >> SHIFT[d]) & (bins - 1)).astype(np.int64), minlength=bins)
        from_top = np.cumsum(hist[::-1])  # from_top[j]: keys in the j + 1 highest bins
        j = int(np.searchsorted(from_top, need))  # first j with from_top[j] >= need
        boundary_bin = bins - 1 - j
        above = int(from_top[j] - hist[boundary_bin])
        whole_bin = above + int(hist[boundary_bin]) == need
        need -= above
        prefix = (0 if resolved_shift == 32 else prefix << BITS[d]) | boundary_bin
        resolved_shift = SHIFT[d]
    taken = (keys >> resolved_shift) > prefix
    at_boundary = (keys >> resolved_shift) == prefix
    if whole_bin:
        taken |= at_boundary
    else:
        taken[np.nonzero(at_boundary)[0][:need]] = True
    return np.nonzero(taken)[0]


def by_sort(scores):
    order = np.lexsort((np.arange(len(scores)), -scores.astype(np.float64)))
    return np.sort(order[:K])


def main():
    rng = np.random.default_rng(20261207)
    n = 262144
    cases = {
        "normal": rng.standard_normal(n),
        "uniform": rng.uniform(-1, 1, n),
        "integers 0-99": rng.integers(0, 100, n).astype(float),
        "rounded normal": np.round(rng.standard_normal(n) * 50) / 50,
    }
    ok = True
    for name, scores in cases.items():
        scores = scores.astype(np.float32)
        same = np.array_equal(select(scores), by_sort(scores))
        ok &= same
        print(f"{name:16s} {'same list as the sort' if same else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
