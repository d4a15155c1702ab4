"""Where a kernel's warps wait, per SASS instruction: reads the CSV of `ncu --import REPORT --page source --csv
--print-source sass` (warp-state sampling of the SourceCounters section) and prints the instructions with the most
stall samples, and the samples summed per opcode: the view that per-kernel stall ratios (ncu_state.sh) lack.

    python -m tools.ncu_source_top runs/ncu_source/gluon_query_fwd_rows.csv --top 30
"""
import argparse
import collections
import csv
import sys

from tools.compile_check import sass_opcode


def _column(header, *needles):
    """Index of the first column whose name contains every needle (case-insensitive), or None."""
    for i, name in enumerate(header):
        if all(n.lower() in name.lower() for n in needles):
            return i
    return None


def _number(text: str) -> float:
    try:
        return float(text.replace(",", "") or 0)
    except ValueError:
        return 0.0


def read_source_csv(path):
    """[(address, sass text, all samples, not-issued samples)] of the CSV's instruction rows."""
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    for k, row in enumerate(rows):            # ncu prints a few banner lines before the header
        src = _column(row, "source")
        every = _column(row, "warp stall sampling", "all")
        if src is not None and every is not None:
            header, body = row, rows[k + 1:]
            break
    else:
        raise SystemExit(f"{path}: no header with a Source and a 'Warp Stall Sampling (All Samples)' column")
    addr = _column(header, "address")
    idle = _column(header, "warp stall sampling", "not")
    out = []
    for r in body:
        if len(r) <= max(src, every):
            continue
        out.append((r[addr] if addr is not None else "", r[src].strip(), _number(r[every]),
                    _number(r[idle]) if idle is not None else 0.0))
    return out


def summarize(rows, top: int):
    total = sum(r[2] for r in rows) or 1.0
    lines = [f"{len(rows)} instructions, {total:.0f} samples"]
    for address, sass, every, idle in sorted(rows, key=lambda r: -r[2])[:top]:
        lines.append(f"  {every / total:6.1%}  (not issued {idle / total:5.1%})  {address:>8}  {sass[:90]}")
    per_op = collections.Counter()
    for _, sass, every, _ in rows:
        per_op[sass_opcode(sass)] += every
    lines.append("per opcode: " + ", ".join(f"{op} {n / total:.1%}" for op, n in per_op.most_common(12)))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    for path in args.csv:
        print(f"== {path}")
        print("\n".join(summarize(read_source_csv(path), args.top)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
