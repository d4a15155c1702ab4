"""Figures of `python -m longctx.evaluate`: ICL curves (one per evaluated context / step, with a legend) and the
retrieval heatmap. Constrained layout keeps the (wrapped) title and the labels inside the figure."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from longctx.eval.summary import percent
from longctx.plotting import fill_title, new_figure, pyplot, save_figure


def _figure(figsize):
    fig, ax = new_figure(figsize)
    return pyplot(), fig, ax


def bin_centres(curve: list) -> list[float]:
    """Geometric centre of each [start, end, value] bin (position 0 counted as 1: a log axis)."""
    return [float(np.sqrt(max(a, 1) * b)) for a, b, _ in curve]


def icl_curve_figure(records: list[dict], title: str, train_ctx: int | None = None):
    """(pyplot, figure, axes): each record's ICL curve labelled `ctx C, step S`, its Bayes-optimal curve dashed;
    with `train_ctx` inside the curves' positions, a vertical line marks the training context."""
    plt, fig, ax = _figure((7, 4.5))
    for rec in records:
        label = f"ctx {rec['ctx']}, step {rec['step']}"
        line, = ax.plot(bin_centres(rec["icl_curve"]), [v for *_, v in rec["icl_curve"]], marker=".", lw=1.4,
                        label=label)
        if "bayes_curve" in rec:
            ax.plot(bin_centres(rec["bayes_curve"]), [v for *_, v in rec["bayes_curve"]], "--", lw=1.2,
                    color=line.get_color(), label=f"Bayes-optimal, ctx {rec['ctx']}")
    if train_ctx is not None and any(train_ctx < rec["icl_curve"][-1][1] for rec in records):
        ax.axvline(train_ctx, color="grey", linestyle=":", lw=1.2, zorder=1, label=f"training context ({train_ctx})")
    ax.set_xscale("log")
    ax.set_xlabel("position in context (log scale; bin centres)")
    ax.set_ylabel("heldout loss (nats)")
    ax.set_title(fill_title(title, 5.6, 10), fontsize=10)  # the axes' width: the title is centred on them
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plt, fig, ax


def plot_icl(records: list[dict], path: str | Path, title: str, train_ctx: int | None = None) -> Path:
    _, fig, _ = icl_curve_figure(records, title, train_ctx)
    return save_figure(fig, path)


def retrieval_figure(rec: dict, title: str):
    """(pyplot, figure, axes): key accuracy by context (rows) and needle depth (columns), each cell annotated with
    it and, below, the forced-choice digit accuracy (which shows reading before whole keys come right)."""
    acc = np.asarray(rec["key_accuracy"], dtype=np.float64)
    choice = np.asarray(rec["choice_accuracy"], dtype=np.float64)
    width = max(5.0, 1.6 + 0.9 * len(rec["depths"]))  # wide enough for the two-line axis label
    plt, fig, ax = _figure((width, 2.8 + 0.5 * len(rec["contexts"])))
    image = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            ax.text(j, i, f"{acc[i, j]:.0%}\n({choice[i, j]:.0%})", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(rec["depths"])), [f"{d:g}" for d in rec["depths"]])
    ax.set_yticks(range(len(rec["contexts"])), [str(c) for c in rec["contexts"]])
    ax.set_xlabel(fill_title(f"needle depth (0 = start of the context)\nin brackets: forced-choice digit accuracy "
                             f"(chance {percent(rec['chance']['choice'])})", width - 1.0, 9), fontsize=9)
    ax.set_ylabel("context (tokens)")
    fig.colorbar(image, ax=ax, label=f"key accuracy (chance {percent(rec['chance']['key'])})")
    ax.set_title(fill_title(title, width - 1.0, 9), fontsize=9)
    return plt, fig, ax


def plot_retrieval(rec: dict, path: str | Path, title: str) -> Path:
    _, fig, _ = retrieval_figure(rec, title)
    return save_figure(fig, path)
