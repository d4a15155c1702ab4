"""evaluate's figures: titles (long ones wrapped) inside the figure, one labelled curve per evaluation and no
colourbar on the ICL plot, the retrieval heatmap's axes labelled with the contexts and depths evaluated."""
from __future__ import annotations

import numpy as np
import pytest

from longctx.eval import icl_summary
from longctx.eval.plots import icl_curve_figure, plot_icl, plot_retrieval, retrieval_figure

LONG_TITLE = ("gpt2_power_p2_small_longcrawl64_ctx65536_s0: step 120000 evaluated at ctx 131072 (trained at 65536), "
              "longcrawl64, 256 heldout documents")


def inside(fig, artist):
    fig.canvas.draw()
    box, frame = artist.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    return box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1


def record(ctx, step, bayes=True):
    pos = np.arange(ctx) + 1.0
    optimum = 1 + 1 / np.sqrt(pos)
    return {"ctx": ctx, "step": step, **icl_summary(optimum + 0.1, 12, optimum if bayes else None)}


def test_icl_plot_title_fits_and_every_curve_is_labelled():
    plt, fig, ax = icl_curve_figure([record(1024, 400), record(2048, 400, bayes=False)], LONG_TITLE)
    try:
        assert inside(fig, ax.title) and inside(fig, ax.xaxis.label) and inside(fig, ax.yaxis.label)
        assert len(fig.axes) == 1  # no colourbar: curves are told apart by the legend
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [
            "ctx 1024, step 400", "Bayes-optimal, ctx 1024", "ctx 2048, step 400"]
        assert ax.get_xlabel().startswith("position in context") and ax.get_ylabel() == "heldout loss (nats)"
        assert ax.get_title().replace("\n", " ") == LONG_TITLE
    finally:
        plt.close(fig)


def test_icl_plot_marks_the_training_context_inside_a_longer_evaluation():
    """Evaluated at twice the training context: a vertical line at the training context, named in the legend; none
    where the evaluation ends at it."""
    plt, fig, ax = icl_curve_figure([record(512, 400)], "t", train_ctx=256)
    (marker,) = [line for line in ax.get_lines() if line.get_label() == "training context (256)"]
    assert list(marker.get_xdata()) == [256, 256]
    assert "training context (256)" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)
    plt, fig, ax = icl_curve_figure([record(256, 400)], "t", train_ctx=256)
    assert not [line for line in ax.get_lines() if line.get_label().startswith("training context")]
    plt.close(fig)


def test_retrieval_heatmap_axes_name_contexts_and_depths(tmp_path):
    rec = {"contexts": [1024, 4096], "depths": [0.0, 0.5, 1.0], "key_accuracy": [[1.0, 0.5, 0.0], [0.25, 1.0, 1.0]],
           "choice_accuracy": [[1.0, 0.7, 0.1], [0.3, 1.0, 1.0]], "chance": {"key": 1e-5, "digit": 0.1, "choice": 0.1}}
    plt, fig, ax = retrieval_figure(rec, LONG_TITLE)
    try:
        assert inside(fig, ax.title)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "0.5", "1"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["1024", "4096"]
        assert sorted(t.get_text() for t in ax.texts) == sorted(
            ["100%\n(100%)", "50%\n(70%)", "0%\n(10%)", "25%\n(30%)", "100%\n(100%)", "100%\n(100%)"])
        assert "forced-choice digit accuracy (chance 10%)" in ax.get_xlabel()
        assert fig.axes[1].get_ylabel() == "key accuracy (chance 0.001%)"  # in percent, as the cells
    finally:
        plt.close(fig)
    assert plot_retrieval(rec, tmp_path / "r.png", "t").stat().st_size > 5_000
    assert plot_icl([record(256, 1)], tmp_path / "c.png", "t").stat().st_size > 5_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png", "r.png"]  # no temporary file left
