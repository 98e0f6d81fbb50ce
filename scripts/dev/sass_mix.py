#!/usr/bin/env python3
"""Static instruction mix of one kernel in a cubin, without a GPU: the opcode counts of the whole kernel, or of an
address range, grouped by opcode and (with -g line info in the cubin) by source line; with a second cubin, the
per-opcode difference. Used to see where a kernel's instructions go before spending device time on it.

Usage: sass_mix.py CUBIN KERNEL_SUBSTRING [--range 0xLO-0xHI] [--lines N] [--against OLD.cubin]
Make the cubin with the library's flags plus -lineinfo, e.g.
  nvcc -std=c++20 -arch=sm_90a -cubin -O3 --expt-relaxed-constexpr -lineinfo -I include -I src -I src/cuda \\
       src/cuda/tq_decode.cu -o dec.cubin
  sass_mix.py dec.cubin decode_kernelILi128ELi4ELi3ELb1 --lines 30
nvdisasm: $NVDISASM, else on PATH (CUDA toolkit, or the PyPI wheel nvidia-cuda-nvdisasm)."""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys


def disassemble(cubin):
    tool = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not tool:
        sys.exit("nvdisasm not found: set NVDISASM or put it on PATH (pip install nvidia-cuda-nvdisasm)")
    return subprocess.run([tool, "-c", "-g", cubin], capture_output=True, text=True, check=True).stdout


def instructions(text, kernel):
    """(address, opcode, source line) of every instruction of the first kernel whose name contains `kernel`."""
    out, name, line = [], None, None
    for raw in text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", raw)
        if m:
            if name is not None and out:
                break
            name = m.group(1) if kernel in m.group(1) else None
            continue
        if name is None:
            continue
        m = re.search(r'## File "([^"]+)", line (\d+)', raw)
        if m:
            line = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+([^;]*);", raw)
        if m:
            opcode = re.sub(r"^@!?U?P\S+\s+", "", m.group(2).strip()).split()[0].split(".")[0]
            out.append((int(m.group(1), 16), opcode, line))
    if not out:
        sys.exit(f"no kernel matching '{kernel}'")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cubin")
    ap.add_argument("kernel")
    ap.add_argument("--range", help="0xLO-0xHI: only instructions at these addresses (a loop body)")
    ap.add_argument("--lines", type=int, default=0, help="print the N source lines with the most instructions")
    ap.add_argument("--against", help="an older cubin: print the per-opcode difference")
    args = ap.parse_args()
    ins = instructions(disassemble(args.cubin), args.kernel)
    if args.range:
        lo, hi = (int(x, 16) for x in args.range.split("-"))
        ins = [i for i in ins if lo <= i[0] <= hi]
    ops = collections.Counter(op for _, op, _ in ins)
    print(f"{len(ins)} instructions: " + "  ".join(f"{op}:{n}" for op, n in ops.most_common()))
    if args.lines:
        by_line = collections.defaultdict(collections.Counter)
        for _, op, line in ins:
            by_line[line][op] += 1
        for line, c in sorted(by_line.items(), key=lambda kv: -sum(kv[1].values()))[: args.lines]:
            print(f"{sum(c.values()):6d}  {line}  " + " ".join(f"{op}:{n}" for op, n in c.most_common(4)))
    if args.against:
        old = collections.Counter(op for _, op, _ in instructions(disassemble(args.against), args.kernel))
        print(f"against {args.against}: {sum(old.values())} -> {len(ins)}")
        for op in sorted(set(old) | set(ops), key=lambda o: ops[o] - old[o]):
            if ops[op] != old[op]:
                print(f"  {op:10s}{old[op]:6d}{ops[op]:6d}{ops[op] - old[op]:+6d}")


if __name__ == "__main__":
    main()
