#!/usr/bin/env python3
"""Registers, stack frame and spills of every CUDA kernel, from ptxas's report (no GPU needed).

Why: a kernel that keeps ~200 KB of shared memory per block leaves little L1 for local memory, so a few spilled
registers reloaded once per tile cost more than the registers saved (round 25 of docs/cuda-dsv4-kernels-history.md: 36
bytes of spills made the DeepSeek-V4 attention's decode step 10 % slower; without them the same change was 4.5 %
faster). Run it after changing a kernel, before spending GPU time on it.

Usage: scripts/dev/kernel_spills.py [--all] [FILE.cu ...]
       (default: every .cu file under src/cuda and src/cuda_dsv4; prints only kernels with spills or a stack
        frame unless --all). Compiles each file for sm_90a with the project's include paths, one at a time.
"""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
NVCC_FLAGS = ["-std=c++20", "-arch=sm_90a", "-cubin", "-O3", "--expt-relaxed-constexpr", "-Xptxas", "-v",
              "-I", "include", "-I", "src", "-I", "src/cuda", "-I", "src/cuda_dsv4", "-o", "/dev/null"]
ENTRY = re.compile(r"Compiling entry function '(\S+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def demangle(symbol):
    """A short readable name: the demangled kernel with its namespaces dropped."""
    try:
        name = subprocess.run(["c++filt", symbol], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return symbol
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    return re.sub(r"kvcompact::cuda::(?:dsv4::|tq::)?detail::", "", name)


def kernels(path):
    """[(kernel, registers, stack bytes, spill stores, spill loads)] of one .cu file, from ptxas -v."""
    run = subprocess.run(["nvcc", *NVCC_FLAGS, str(path)], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"error: nvcc failed on {path}:\n{run.stderr[-2000:]}")
    out, name, frame = [], None, (0, 0, 0)
    for line in run.stderr.splitlines():
        if m := ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif name and (m := FRAME.search(line)):
            frame = tuple(int(v) for v in m.groups())
        elif name and (m := USED.search(line)):
            out.append((demangle(name), int(m.group(1)), *frame))
            name = None
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list every kernel, not only those with local memory")
    parser.add_argument("files", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    files = args.files or sorted([*(ROOT / "src/cuda").glob("*.cu"), *(ROOT / "src/cuda_dsv4").glob("*.cu")])
    print(f"{'regs':>4} {'stack':>5} {'spill st':>8} {'spill ld':>8}  file: kernel")
    spilling = 0
    for path in files:
        print(f"  ({path.name} ...)", file=sys.stderr, flush=True)
        for kernel, regs, stack, stores, loads in kernels(path.resolve()):
            spilling += stores > 0 or loads > 0
            if args.all or stack or stores or loads:
                print(f"{regs:>4} {stack:>5} {stores:>8} {loads:>8}  {path.name}: {kernel}")
    print(f"{spilling} kernel instance(s) spill")


if __name__ == "__main__":
    main()
