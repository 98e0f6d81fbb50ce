"""Reading the per-instruction SASS page of Nsight Compute (`ncu --page source --csv --print-source sass`),
plain or gzipped, for ncu_hot_sass.py and ncu_sass_summary.py."""
import csv
import gzip
import sys


def number(text):
    """A cell as a float ('1,234' -> 1234.0); '-' and empty cells are 0."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read(path=None):
    """(header, rows) of the SASS page in path (.gz or plain; stdin when None): the rows after the first one that
    has a 'Source' column, with as many cells as it."""
    if path is None:
        stream = sys.stdin
    elif path.endswith(".gz"):
        stream = gzip.open(path, "rt", newline="")
    else:
        stream = open(path, newline="")
    with stream:
        rows = [row for row in csv.reader(stream) if row]
    header_at = next((i for i, row in enumerate(rows) if "Source" in row), None)
    if header_at is None:
        sys.exit("no 'Source' column in the ncu output")
    header = rows[header_at]
    return header, [row for row in rows[header_at + 1:] if len(row) == len(header)]


def column(header, prefix):
    """Index of the first column whose name starts with prefix, or None."""
    return next((i for i, name in enumerate(header) if name.startswith(prefix)), None)


def opcode(source):
    """'@!P0 LDG.E.128 R4, [R2]' -> 'LDG'."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"
