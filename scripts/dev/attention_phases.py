#!/usr/bin/env python3
"""Reads the decode benchmark's output built with scripts/dev/attention_phase_timing.patch (its PHASES lines) on
stdin and prints the warpgroup attention kernel's cycles per phase: per tile for the loop's phases, per block for
the prologue and epilogue, for a thread of an S warpgroup (thread 0) and one of the others (thread 256)."""
from phase_lines import timing_lines

NAMES = ["prologue", "barrier A", "S issue", "next loads", "S wait", "softmax 1", "barrier B", "P + sums",
         "barrier C", "P V issue", "decode", "P V wait", "epilogue"]
ONCE = (0, 12)

for f in timing_lines("PHASES"):
    thread, blocks, tiles, cycles, ns = int(f[2]), int(f[4]), int(f[6]), int(f[8]), int(f[10])
    if blocks == 0:
        continue
    phases = [int(v) for v in f[12:25]]
    per_block_tiles = tiles / blocks
    print(f"thread {thread}: {blocks} blocks, {per_block_tiles:.2f} tiles each, {cycles / blocks:.0f} cycles "
          f"({ns / blocks / 1000:.2f} us) per block, {cycles / ns:.3f} cycles/ns")
    for i, (name, v) in enumerate(zip(NAMES, phases)):
        per = v / blocks / (1 if i in ONCE else per_block_tiles)
        print(f"  {name:11s} {per:8.0f} {'per block' if i in ONCE else 'per tile'}")
