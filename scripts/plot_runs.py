"""Compare runs: a metric from metrics.jsonl against training FLOPs (the paper's loss-per-FLOP view),
tokens or steps.

    python scripts/plot_runs.py runs/gpt2_exp_* runs/gpt2_power_p2_* --x flops --y best_context_loss -o cmp.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

AXES = ("flops", "tokens", "step")


def load(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(run_dirs: list[Path], x: str, y: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run_dir in run_dirs:
        records = load(run_dir)
        if records and y not in records[0]:
            raise ValueError(f"--y={y!r}: not a key of {run_dir}/metrics.jsonl (keys: {', '.join(records[0])})")
        ax.plot([r[x] for r in records], [r[y] for r in records], marker=".", label=run_dir.name)
    if x == "flops":
        ax.set_xscale("log")
    ax.set_xlabel({"flops": "training FLOPs (3x forward, model count)"}.get(x, x))
    ax.set_ylabel(y)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (holding metrics.jsonl)")
    parser.add_argument("--x", choices=AXES, default="flops")
    parser.add_argument("--y", default="best_context_loss")
    parser.add_argument("-o", "--out", type=Path, default=Path("runs_comparison.png"))
    args = parser.parse_args(argv)
    path = plot(args.runs, args.x, args.y, args.out)
    print(path)
    return path


if __name__ == "__main__":
    main()
