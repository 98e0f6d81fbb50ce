#!/usr/bin/env python3
"""Code size of every kernel in cubins: SASS instructions (16 bytes each) per `.text.<kernel>` section.

Why: a kernel whose code outgrows the multiprocessor's instruction cache waits on instruction fetch, and a
1024-thread block that walks through long inlined phases one after another feels it (round 16 of
docs/cuda-dsv4-kernels-history.md: the top-k at 9208 instructions ran 1-3 % slower per decode step than at 5944, even on
paths it did not take). Reads the ELF section table directly, so it needs no CUDA tools.

Usage: scripts/dev/cubin_code_size.py [--min N] X.cubin [Y.cubin ...]
       (build a cubin: nvcc -std=c++17 -arch=sm_90a -cubin -O3 --expt-relaxed-constexpr -I include -I src
        -I src/cuda_dsv4 FILE.cu -o X.cubin)
"""
import argparse
import struct
import subprocess
import sys


def text_sections(path):
    """(kernel symbol, instructions) for each .text.* section of a 64-bit little-endian ELF cubin."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file (a cubin)")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = []
    for name_offset, _type, _flags, _addr, _offset, size, *_ in headers:
        end = data.index(b"\0", names_at + name_offset)
        name = data[names_at + name_offset:end].decode()
        if name.startswith(".text."):
            out.append((name[len(".text."):], size // 16))
    return out


def demangle(symbols):
    try:
        res = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True, check=True)
        return res.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return symbols


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubins", nargs="+")
    ap.add_argument("--min", type=int, default=0, help="only kernels with at least this many instructions")
    args = ap.parse_args()
    rows = []
    for path in args.cubins:
        try:
            rows += [(n, sym, path) for sym, n in text_sections(path) if n >= args.min]
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    rows.sort(reverse=True)
    names = demangle([sym for _, sym, _ in rows])
    for (n, _, path), name in zip(rows, names):
        print(f"{n:7d} instr {n * 16 / 1024:7.1f} KB  {name}  [{path}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
