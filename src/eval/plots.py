"""Figures of `python -m longctx.evaluate`: ICL curves (one per evaluated context / step, with a legend) and the
retrieval heatmap. Constrained layout keeps the (wrapped) title and the labels inside the figure."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np


def _figure(figsize):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return plt, fig, ax


def _save(plt, fig, path: Path) -> Path:
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def bin_centres(curve: list) -> list[float]:
    """Geometric centre of each [start, end, value] bin (position 0 counted as 1: a log axis)."""
    return [float(np.sqrt(max(a, 1) * b)) for a, b, _ in curve]


def icl_curve_figure(records: list[dict], title: str):
    """(pyplot, figure, axes): each record's ICL curve labelled `ctx C, step S`, its Bayes-optimal curve dashed."""
    plt, fig, ax = _figure((7, 4.5))
    for rec in records:
        label = f"ctx {rec['ctx']}, step {rec['step']}"
        line, = ax.plot(bin_centres(rec["icl_curve"]), [v for *_, v in rec["icl_curve"]], marker=".", lw=1.4,
                        label=label)
        if "bayes_curve" in rec:
            ax.plot(bin_centres(rec["bayes_curve"]), [v for *_, v in rec["bayes_curve"]], "--", lw=1.2,
                    color=line.get_color(), label=f"Bayes-optimal, ctx {rec['ctx']}")
    ax.set_xscale("log")
    ax.set_xlabel("position in context (log scale; bin centres)")
    ax.set_ylabel("heldout loss (nats)")
    ax.set_title(textwrap.fill(title, 70), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plt, fig, ax


def plot_icl(records: list[dict], path: str | Path, title: str) -> Path:
    plt, fig, _ = icl_curve_figure(records, title)
    return _save(plt, fig, path)


def retrieval_figure(rec: dict, title: str):
    """(pyplot, figure, axes): key accuracy by context (rows) and needle depth (columns), each cell annotated with
    it and, below, the forced-choice digit accuracy (which shows reading before whole keys come right)."""
    acc = np.asarray(rec["key_accuracy"], dtype=np.float64)
    choice = np.asarray(rec["choice_accuracy"], dtype=np.float64)
    plt, fig, ax = _figure((1.6 + 0.9 * len(rec["depths"]), 1.6 + 0.5 * len(rec["contexts"])))
    image = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            ax.text(j, i, f"{acc[i, j]:.0%}\n({choice[i, j]:.0%})", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(rec["depths"])), [f"{d:g}" for d in rec["depths"]])
    ax.set_yticks(range(len(rec["contexts"])), [str(c) for c in rec["contexts"]])
    ax.set_xlabel(f"needle depth (0 = start of the context); in brackets: forced-choice digit accuracy "
                  f"(chance {rec['chance']['choice']:.0%})")
    ax.set_ylabel("context (tokens)")
    fig.colorbar(image, ax=ax, label=f"key accuracy (chance {rec['chance']['key']:.2g})")
    ax.set_title(textwrap.fill(title, 60), fontsize=9)
    return plt, fig, ax


def plot_retrieval(rec: dict, path: str | Path, title: str) -> Path:
    plt, fig, _ = retrieval_figure(rec, title)
    return _save(plt, fig, path)
