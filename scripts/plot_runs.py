"""Compare runs: a metric from metrics.jsonl against training FLOPs (the paper's loss-per-FLOP view),
tokens or steps.

    python scripts/plot_runs.py runs/gpt2_exp_* runs/gpt2_power_p2_* --x flops --y best_context_loss -o cmp.png

Without -o the figure is runs_comparison.png in the current folder; a relative -o is taken from the current folder
too, and the absolute path written is printed. An existing file is refused unless --overwrite is given.

FLOPs and tokens count every stage the weights trained in (`flops_all_stages`: a run started from another's weights,
`trainer.init_from` or a later stage of `trainer.stages`, starts at what those cost), as `longctx.report` does.
A cut last line of a metrics.jsonl (a run still writing) is skipped with a warning naming the file and line.
For intervals, seeds and labels from the runs' configs, use `python -m longctx.report`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.plotting import save_figure, widen_for_legend  # noqa: E402
from longctx.report.runs import load_run, short_names  # noqa: E402

AXES = ("flops", "tokens", "step")
DEFAULT_OUT = "runs_comparison.png"


def load(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    records = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            print(f"warning: {path}:{number}: incomplete line skipped (a run still writing?)", file=sys.stderr)
            continue
        if records and isinstance(record, dict) and not record.get("step", 0) > records[-1].get("step", -1):
            # the report refuses such a file too (runs.read_metrics): the trainer never writes a step twice
            raise ValueError(f"{path}:{number}: step {record.get('step')} after step {records[-1].get('step')}: an "
                             f"evaluation repeated or out of order (a file edited or joined from two runs?)")
        records.append(record)
    return records


def unfinished_mark(run_dir: Path) -> str:
    """' (unfinished: step S of ...)' for a run short of its bound (longctx.report's status), '' otherwise or when its
    config cannot tell."""
    try:
        status = load_run(run_dir).status
    except (OSError, ValueError):
        return ""
    return f" ({status})" if status.startswith("unfinished") else ""


def plot(run_dirs: list[Path], x: str, y: str, out: Path) -> Path:
    loaded = [(run_dir, load(run_dir)) for run_dir in run_dirs]   # every run read before anything is drawn
    for run_dir, records in loaded:
        if records and y not in records[0]:
            raise ValueError(f"--y={y!r}: not a key of {run_dir}/metrics.jsonl (keys: {', '.join(records[0])})")
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")  # room for the legend right of the axes
    names = short_names([run_dir.resolve() for run_dir in run_dirs])  # two sweeps' runs of one name stay apart
    for (run_dir, records), name in zip(loaded, names):
        points = [(r.get(f"{x}_all_stages", r[x]), r[y]) for r in records if x in r and y in r]
        if points:
            ax.plot(*zip(*points), marker=".", label=name + unfinished_mark(run_dir))
    if x == "flops":
        ax.set_xscale("log")
    ax.set_xlabel({"flops": "training FLOPs, every stage (3x forward, model count)",
                   "tokens": "training tokens, every stage"}.get(x, x))
    ax.set_ylabel(y)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:   # right of the axes: never over a curve or the axis label
        widen_for_legend(fig, ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0))
    return save_figure(fig, out)


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (holding metrics.jsonl)")
    parser.add_argument("--x", choices=AXES, default="flops")
    parser.add_argument("--y", default="best_context_loss")
    parser.add_argument("-o", "--out", type=Path, default=Path(DEFAULT_OUT),
                        help=f"the PNG to write (default: {DEFAULT_OUT} in the current folder; a relative path is "
                             f"taken from the current folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace the -o file when it exists already")
    args = parser.parse_args(argv)
    args.out = args.out.expanduser().absolute()
    if args.out.is_dir() or not args.out.parent.is_dir():
        parser.exit(2, f"error: -o {args.out}: give a PNG file path in an existing folder\n")
    if (args.out.exists() or args.out.is_symlink()) and not args.overwrite:
        parser.exit(2, f"error: -o {args.out}: exists; pass --overwrite to replace it, or give another -o\n")
    try:
        path = plot(args.runs, args.x, args.y, args.out)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
