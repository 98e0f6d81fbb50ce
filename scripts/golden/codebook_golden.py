#!/usr/bin/env python3
"""Independent Lloyd–Max solver for the TurboQuant coordinate density; writes tests/golden/codebooks.json.

The C++ solver (src/tq/codebook.cpp) uses closed-form cell moments, an incomplete-beta continued fraction
and Newton-accelerated Lloyd iterations. This script shares none of that: every cell moment is an adaptive
quadrature (scipy.integrate.quad) of f(x) = (1 − x²)^((d−3)/2) / B(½, (d−1)/2), and the fixed point
c = T(c) of Lloyd's map is found with scipy.optimize.fsolve (MINPACK hybrd), then polished with plain
Lloyd steps. tests/unit/tq/codebook_test.cpp compares the two.

Usage: python3 scripts/golden/codebook_golden.py [output.json]   (needs numpy and scipy)
"""
import json
import math
import sys
import warnings

import numpy as np
from scipy import integrate, optimize, special

DIMS = [16, 32, 64, 80, 96, 128, 192, 256, 576, 1024]
BITS = [1, 2, 3, 4, 5]


def make_density(d):
    log_c = -special.betaln(0.5, (d - 1) / 2.0)
    m = (d - 3) / 2.0

    def f(x):
        if abs(x) >= 1.0:
            return 0.0
        return math.exp(log_c + m * math.log1p(-x * x))

    return f


def cell_integral(g, lo, hi, sigma):
    # Break points every σ inside the bulk so quad does not miss the narrow peak.
    points = [p for p in np.arange(-12, 13) * sigma if lo < p < hi]
    value, _ = integrate.quad(g, lo, hi, points=points or None, epsabs=1e-17, epsrel=1e-14, limit=400)
    return value


def lloyd_map(c, f, sigma):
    edges = [-1.0] + [(a + b) / 2.0 for a, b in zip(c[:-1], c[1:])] + [1.0]
    out = np.empty(len(c))
    for k in range(len(c)):
        m0 = cell_integral(f, edges[k], edges[k + 1], sigma)
        m1 = cell_integral(lambda x: x * f(x), edges[k], edges[k + 1], sigma)
        out[k] = m1 / m0
    return out


def solve(d, bits):
    f = make_density(d)
    sigma = 1.0 / math.sqrt(d)
    n = 2 ** bits
    # Start: the Gaussian compander guess (quantiles of N(0, 3σ²)); nothing shared with the C++ tables.
    p = (np.arange(n) + 0.5) / n
    c0 = math.sqrt(3.0) * sigma * np.sqrt(2.0) * special.erfinv(2 * p - 1)
    half = n // 2
    # Solve on the positive half only (the density is even, so the codebook is antisymmetric).
    def full(pos):
        return np.concatenate([-pos[::-1], pos])

    def residual(pos):
        c = full(np.sort(pos))
        return lloyd_map(c, f, sigma)[half:] - c[half:]

    pos = c0[half:]
    for _ in range(20):  # a few Lloyd steps first to get into Newton's basin
        pos = lloyd_map(full(pos), f, sigma)[half:]
    with warnings.catch_warnings():
        # xtol is deliberately beyond reach; the Lloyd-step check below is the acceptance test.
        warnings.simplefilter("ignore", RuntimeWarning)
        pos = optimize.fsolve(residual, pos, xtol=1e-15)
    for _ in range(3):
        pos = lloyd_map(full(pos), f, sigma)[half:]
    c = full(pos)
    move = float(np.max(np.abs(lloyd_map(c, f, sigma) - c)))
    edges = [-1.0] + [(a + b) / 2.0 for a, b in zip(c[:-1], c[1:])] + [1.0]
    per_coordinate = sum(
        cell_integral(lambda x, ck=ck: (x - ck) ** 2 * f(x), edges[k], edges[k + 1], sigma) for k, ck in enumerate(c)
    )
    return c, d * per_coordinate, move


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/codebooks.json"
    books = []
    for d in DIMS:
        for bits in BITS:
            c, distortion, move = solve(d, bits)
            if move > 1e-12:
                raise SystemExit(f"d={d} bits={bits}: Lloyd step still moves {move:.2e}")
            books.append({"head_dim": d, "bits": bits, "distortion": distortion,
                          "centroids": [float(v) for v in c], "lloyd_move": move})
            print(f"d={d:5d} b={bits} D_mse={distortion:.10f} move={move:.1e}", file=sys.stderr)
    doc = {
        "generator": "scripts/golden/codebook_golden.py (scipy quad + fsolve; independent of src/tq/codebook.cpp)",
        "density": "f(x) = (1 - x^2)^((d-3)/2) / B(1/2, (d-1)/2) on [-1, 1]",
        "codebooks": books,
    }
    with open(out_path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
