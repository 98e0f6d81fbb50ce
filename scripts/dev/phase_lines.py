"""Shared by the phase-timing readers (topk_phases.py, attention_phases.py): the benchmark's output on stdin,
every non-empty line passed through to stdout except the timing lines, which are yielded split into fields."""
import sys


def timing_lines(prefix):
    """Yields the whitespace-split fields of each stdin line that starts with prefix; prints every other
    non-empty line unchanged."""
    for line in sys.stdin:
        if line.startswith(prefix):
            yield line.split()
        elif line.strip():
            print(line.rstrip())
