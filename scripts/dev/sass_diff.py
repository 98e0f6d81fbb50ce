#!/usr/bin/env python3
"""Compares the SASS of the kernels in two sets of cubins, instruction by instruction, ignoring addresses, branch
labels and the file-specific anonymous-namespace part of kernel names. Used to check that a refactor (moving code
between files, renaming, rewrapping) leaves the compiled kernels unchanged, without a GPU.

Usage: sass_diff.py OLD.cubin[,OLD2.cubin...] NEW.cubin[,NEW2.cubin...]
Make the cubins with the library's flags, e.g.
  nvcc -std=c++17 -arch=sm_90a -cubin -O3 --expt-relaxed-constexpr -I include -I src -I src/cuda_dsv4 X.cu -o X.cubin
nvdisasm: $NVDISASM, else on PATH (CUDA toolkit, or the PyPI wheel nvidia-cuda-nvdisasm). Exit 0 when every kernel
is identical."""
import os
import re
import shutil
import subprocess
import sys


def kernels(cubins):
    tool = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not tool:
        sys.exit("nvdisasm not found: set NVDISASM or put it on PATH (pip install nvidia-cuda-nvdisasm)")
    out = {}
    for cubin in cubins.split(","):
        text = subprocess.run([tool, "-c", cubin], capture_output=True, text=True, check=True).stdout
        name = None
        for line in text.splitlines():
            m = re.match(r"\s*\.text\.(\S+):", line)
            if m:
                name = re.sub(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "(anon)", m.group(1))
                out[name] = []
                continue
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+([^;]*);", line)
            if m and name:
                out[name].append(re.sub(r"0x[0-9a-f]{8,}|`\([^)]*\)", "", m.group(1)).strip())
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    same = True
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            print(f"only in {'new' if a is None else 'old'}: {name}")
            same = False
        elif a != b:
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"differs: {name} ({len(a)} vs {len(b)} instructions; first at {i})")
            same = False
        else:
            print(f"identical: {name} ({len(a)} instructions)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
