#!/usr/bin/env python3
"""Independent numpy reference for the DeepSeek-V4 math; writes tests/golden/dsv4/math_golden.json.

Shares no code with src/dsv4: the RoPE / YaRN tables are computed with numpy float32 arithmetic (a
correctly rounded float32 pow, plus numpy's own float32 pow for comparison), FP8 / FP4 rounding uses log2 + round-half-even on the scaled
value (the C++ oracle searches the value grid, the fast path works on bits), the Hadamard transform is a
Sylvester matrix product, and two ratio-4 compressor rows go through pooling, RMSNorm, RoPE and FP8 in float64.
tests/unit/dsv4/math_golden_test.cpp compares the C++ oracles and fast paths with these values.
All inputs come from an integer formula, so the C++ test regenerates them bit for bit.

Usage: python3 scripts/golden/math_dsv4_golden.py [output.json]   (needs numpy)
"""
import json
import math
import sys

import numpy as np

F32 = np.float32


def val(k, salt, scale=1.0):
    """Deterministic input: ((k * 7919 + salt * 104729) mod 2001 - 1000) / 400 * scale, rounded to float32."""
    return F32(((k * 7919 + salt * 104729) % 2001 - 1000) / 400.0 * scale)


def vec(n, salt, scale=1.0):
    return np.array([val(k, salt, scale) for k in range(n)], dtype=np.float32)


def inv_freqs(theta, yarn, numpy_powf=False):
    """theta^(2i/64) in float32 (correctly rounded: float64 pow rounded once, as glibc powf gives; or numpy's
    own float32 pow, which is 1 ulp off for a few i), its float32 reciprocal, then the YaRN blend in float32."""
    dim = 64
    e = np.arange(0, dim, 2, dtype=np.float32) / F32(dim)
    if numpy_powf:
        p = F32(theta) ** e
    else:
        p = np.array([F32(theta ** float(x)) for x in e], dtype=np.float32)
    f = (F32(1.0) / p).astype(np.float32)
    if yarn:
        def corr(r):
            return dim * math.log(65536 / (r * 2 * math.pi)) / (2 * math.log(theta))
        low = max(math.floor(corr(32)), 0)
        high = min(math.ceil(corr(1)), dim - 1)
        lo, hi = F32(low), F32(high)
        if lo == hi:
            hi = hi + F32(0.001)
        ramp = np.clip((np.arange(32, dtype=np.float32) - lo) / (hi - lo), F32(0), F32(1)).astype(np.float32)
        smooth = (F32(1) - ramp).astype(np.float32)
        f = (f / F32(16) * (F32(1) - smooth) + f * smooth).astype(np.float32)
    return f


def rotate(tail, position, freqs, inverse=False):
    ang = (F32(position) * freqs).astype(np.float32).astype(np.float64)
    if inverse:
        ang = -ang
    x0, x1 = tail[0::2].astype(np.float64), tail[1::2].astype(np.float64)
    out = np.empty(64)
    out[0::2] = x0 * np.cos(ang) - x1 * np.sin(ang)
    out[1::2] = x0 * np.sin(ang) + x1 * np.cos(ang)
    return out


def pow2_ceil_scale(amax, floor, max_code):
    r = F32(max(F32(amax), F32(floor))) * F32(F32(1.0) / F32(max_code))
    return 2.0 ** math.ceil(math.log2(float(r)))


def round_minifloat(q, min_exp, mant_bits, max_val):
    """Nearest value with `mant_bits` mantissa bits, exponent >= min_exp (subnormals below), ties to even."""
    out = np.zeros_like(q)
    for i, v in enumerate(q):
        if v == 0:
            continue
        e = max(math.floor(math.log2(abs(v))), min_exp)
        step = 2.0 ** (e - mant_bits)
        out[i] = min(np.round(v / step) * step, max_val) if v > 0 else max(np.round(v / step) * step, -max_val)
    return out


def block_sim(x, block, floor, max_code, min_exp, mant_bits):
    x = np.array(x, dtype=np.float64)
    for b in range(0, len(x), block):
        blk = x[b:b + block]
        s = pow2_ceil_scale(np.max(np.abs(blk)), floor, max_code)
        q = np.clip(blk / s, -max_code, max_code)
        x[b:b + block] = round_minifloat(q, min_exp, mant_bits, max_code) * s
    return x


def fp8_sim(x):  # e4m3: min normal exponent -6, 3 mantissa bits, max 448
    return block_sim(x, 64, 1e-4, 448.0, -6, 3)


def fp4_sim(x):  # e2m1: min normal exponent 0, 1 mantissa bit, max 6
    return block_sim(x, 32, 6.0 * 2.0 ** -126, 6.0, 0, 1)


def hadamard(x):
    h = np.array([[1.0]])
    while h.shape[0] < len(x):
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h @ np.asarray(x, dtype=np.float64) / math.sqrt(len(x))


def compressor_rows():
    """Ratio 4 with the overlap, width 512, tokens 0..7: rows 0 and 1 through the whole finishing chain."""
    m, d = 4, 512
    a = np.array([vec(2 * d, 1000 + t) for t in range(8)], dtype=np.float32)
    z = np.array([vec(2 * d, 2000 + t, 0.5) for t in range(8)], dtype=np.float32)
    ape = np.array([vec(2 * d, 3000 + i, 0.25) for i in range(m)], dtype=np.float32)
    w = (F32(1.0) + vec(d, 4000, 0.125)).astype(np.float32)
    freqs = inv_freqs(160000.0, True)
    rows = []
    for g in range(2):
        items = []  # (token, column offset)
        if g > 0:
            items += [((g - 1) * m + i, 0) for i in range(m)]
        items += [(g * m + i, d) for i in range(m)]
        score = np.array([z[t, c:c + d].astype(np.float64) + ape[t % m, c:c + d].astype(np.float64) for t, c in items])
        value = np.array([a[t, c:c + d].astype(np.float64) for t, c in items])
        p = np.exp(score - score.max(axis=0))
        p /= p.sum(axis=0)
        y = (p * value).sum(axis=0)
        y = w.astype(np.float64) * (y / math.sqrt(np.mean(y * y) + float(F32(1e-6))))
        y[d - 64:] = rotate(y[d - 64:], g * m, freqs)
        y[:448] = fp8_sim(y[:448])
        rows.append(y)
    return rows


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/dsv4/math_golden.json"
    plain, yarn = inv_freqs(10000.0, False), inv_freqs(160000.0, True)
    tail = vec(64, 5)
    fp8_in = np.concatenate([vec(64, 10 + b, 2.0 ** (6 * b - 18)) for b in range(7)])
    fp4_in = vec(128, 20, 3.0)
    doc = {
        "about": "independent numpy values for tests/unit/dsv4/math_golden_test.cpp; see the script's docstring",
        "input_formula": "((k * 7919 + salt * 104729) mod 2001 - 1000) / 400 * scale, rounded to float32",
        "inv_freq_plain": [float(v) for v in plain],
        "inv_freq_yarn": [float(v) for v in yarn],
        "inv_freq_plain_numpy_powf": [float(v) for v in inv_freqs(10000.0, False, True)],
        "inv_freq_yarn_numpy_powf": [float(v) for v in inv_freqs(160000.0, True, True)],
        "rope": {"salt": 5, "position": 100003, "forward_yarn": list(rotate(tail, 100003, yarn)),
                 "inverse_plain": list(rotate(tail, 77, plain, inverse=True))},
        "fp8": {"salt_base": 10, "scale_exponent": "2^(6b - 18) for block b", "output": list(fp8_sim(fp8_in))},
        "fp4": {"salt": 20, "scale": 3.0, "hadamard_then_fp4": list(fp4_sim(hadamard(fp4_in)))},
        "compressor_ratio4": {"rows": [list(r) for r in compressor_rows()]},
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
