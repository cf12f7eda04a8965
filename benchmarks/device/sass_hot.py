"""The hottest SASS lines of one kernel from `ncu --page source --csv --print-source sass` output.

    python3 benchmarks/device/sass_hot.py SOURCE.csv [N]

Prints the table's columns, then the N (default 60) instructions with the most warp-stall samples, each with
its address, its share of all samples and its text, then the samples summed by opcode and by stall reason.
"""
import csv
import sys
from collections import Counter


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60
    with open(path, newline="") as f:
        lines = f.readlines()
    # ncu prints banner lines before the table: it starts at the header naming the instruction column
    start = next((i for i, line in enumerate(lines) if "Source" in line and "," in line), None)
    if start is None:
        sys.exit(f"{path}: no CSV table; first lines: {lines[:5]}")
    rows = list(csv.DictReader(lines[start:]))
    if not rows:
        sys.exit(f"{path}: no CSV rows")
    cols = list(rows[0].keys())
    sample_col = next((c for c in cols if "Sampling (All" in c), None) or next(c for c in cols if "Sampl" in c)

    def num(r, c):
        try:
            return float(str(r.get(c, "0")).replace(",", "") or 0)
        except ValueError:
            return 0.0

    total = sum(num(r, sample_col) for r in rows) or 1.0
    print(f"columns: {cols}")
    print(f"{len(rows)} instructions, {total:.0f} samples ({sample_col})")
    for r in sorted(rows, key=lambda r: -num(r, sample_col))[:n]:
        print(f"{r.get('Address', '?'):>8} {100 * num(r, sample_col) / total:5.2f}%  {r.get('Source', '')[:90]}")
    by_op = Counter()
    for r in rows:
        op = r.get("Source", "").split()
        op = [t for t in op if not t.startswith("@")]
        by_op[op[0].split(".")[0] if op else "?"] += num(r, sample_col)
    print("by opcode:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_op.most_common(20)))
    # the stall_* columns (all samples, not the "(Not Issued)" ones): where the warps wait, kernel-wide
    reasons = {c: sum(num(r, c) for r in rows) for c in cols if c.startswith("stall_") and "(" not in c}
    stalled = sum(reasons.values()) or 1.0
    print("by stall reason:", ", ".join(f"{c[6:]} {100 * v / stalled:.1f}%"
                                         for c, v in sorted(reasons.items(), key=lambda kv: -kv[1]) if v > 0))


if __name__ == "__main__":
    main()
