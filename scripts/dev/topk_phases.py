#!/usr/bin/env python3
"""Reads the DeepSeek-V4 decode benchmark's output built with scripts/dev/topk_phase_timing.patch (its TOPK_PHASES
lines) on stdin, passes every other line through, and prints the top-k kernel's time per phase: cycles of thread 0
per block and launch, averaged over every timed block (16-block clusters: batch 1; 8-block clusters: batch 8),
and the same in µs at the clock the globaltimer implies (its ns over the same span)."""
from phase_lines import timing_lines

NAMES = ["PDL wait (the score kernel)", "setup (zeroing, cluster arrive)",
         "digit 0: pass over the scores", "digit 0: remote adds + cluster barrier", "digit 0: scan + boundary",
         "digit 1: pass (staged keys, list)", "digit 1: remote adds + cluster barrier", "digit 1: scan + boundary",
         "digits 2+: passes", "digits 2+: remote adds + cluster barriers", "digits 2+: scans",
         "send to leader + cluster barrier", "copy the k keys + cluster barrier", "ranking and placement"]

for f in timing_lines("TOPK_PHASES"):
    cluster = int(f[2])
    v = [int(x) for x in f[3:21]]
    blocks = v[15]
    if blocks == 0:
        continue
    ns, cyc = v[16], v[17]
    ghz = cyc / ns if ns else 0.0
    print(f"top-k, {cluster}-block clusters: {blocks} block-launches, {v[14] / blocks:.2f} digits per launch, "
          f"{cyc / blocks:.0f} cycles = {ns / blocks / 1000:.2f} us per block from the wait's end ({ghz:.3f} GHz)")
    for i, name in enumerate(NAMES):
        c = v[i] / blocks
        us = c / ghz / 1000 if ghz else 0.0
        print(f"  {name:42s} {c:9.0f} cycles {us:7.2f} us")
