"""Every figure the package and its scripts draw holds all of its text: titles, axis and tick labels, legends and
annotations lie inside the figure at its own size (longctx.plotting.clipped_text), with run names and titles as
long as real runs give them. Each figure is drawn by the function the package calls and kept open to be read."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from report_fixtures import fake_run

from longctx.eval import icl_summary
from longctx.plotting import attention_label, clipped_text, fill_title, pyplot, readable_label

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
LONG_NAME = "gpt2_power_p2_small_longcrawl64_ctx65536_warmup2000_lr0.0006_s0"
LONG_TITLE = (f"{LONG_NAME}: step 120000 evaluated at ctx 131072 (trained at 65536), longcrawl64, "
              f"256 heldout documents")


@pytest.fixture
def kept(monkeypatch):
    """The figures that the savers close, kept open to be read: [figure, ...] in drawing order."""
    import matplotlib.pyplot as plt
    real_close, figures = plt.close, []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    yield figures
    for fig in figures:
        real_close(fig)


def whole(fig) -> None:
    assert clipped_text(fig) == [], f"text cut at the figure's edges: {clipped_text(fig)}"


def evaluation(ctx: int, step: int, bayes: bool = True) -> dict:
    optimum = 1 + 1 / np.sqrt(np.arange(ctx) + 1.0)
    return {"ctx": ctx, "step": step, **icl_summary(optimum + 0.1, 12, optimum if bayes else None)}


def test_the_training_icl_curves_hold_a_long_run_name(tmp_path, kept):
    from longctx.train.loggers import plot_icl_curves
    run = fake_run(tmp_path / "r", "power", 512, 0.1, steps=(10, 20, 30))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    plot_icl_curves(records, tmp_path / "icl_curves.png", f"{LONG_NAME}: ICL curves over training")  # the trainer's
    whole(kept[-1])
    assert kept[-1].axes[0].get_title().replace("\n", " ") == f"{LONG_NAME}: ICL curves over training"


def test_evaluates_figures_hold_their_titles_and_labels(tmp_path, kept):
    from longctx.eval.plots import plot_icl, plot_retrieval
    plot_icl([evaluation(512, 400), evaluation(1024, 400, bayes=False)], tmp_path / "icl.png", LONG_TITLE, 256)
    whole(kept[-1])
    for contexts, depths in (([1024, 4096], [0.0, 0.5, 1.0]), ([256], [0.0, 0.25, 0.5, 0.75, 1.0])):
        shape = (len(contexts), len(depths))
        rec = {"contexts": contexts, "depths": depths, "key_accuracy": np.full(shape, 0.5).tolist(),
               "choice_accuracy": np.full(shape, 0.7).tolist(), "chance": {"key": 4 ** -4, "choice": 0.25}}
        plot_retrieval(rec, tmp_path / "passkey.png", f"{LONG_NAME}: passkey, step 120000 (trained at ctx 65536), "
                                                      f"20 trials per cell, 5-symbol keys of base 10")
        whole(kept[-1])


@pytest.fixture
def runs(tmp_path):
    from longctx.report import label_runs, load_run
    made = [load_run(fake_run(tmp_path / f"{att}_{ctx}", att, ctx, off, doc_bins=True))
            for att, ctx, off in [("exp", 512, 0.1), ("exp", 1024, 0.1), ("power", 512, 0.05), ("power", 1024, 0.05)]]
    made += [load_run(fake_run(tmp_path / f"power_s{s}", "power", 512, 0.05, seed=s, doc_bins=True)) for s in (1, 2)]
    label_runs(made)
    return made


def test_the_reports_figures_hold_a_long_title_and_their_legends(runs):
    from longctx.report import figures
    from longctx.report.runs import group_runs
    groups = group_runs(runs)
    drawn = [figures.draw_icl_overlay(groups, runs, LONG_TITLE, n_boot=50),
             figures.draw_gap_to_optimum(groups, LONG_TITLE, n_boot=50),
             figures.draw_paired_differences(groups, LONG_TITLE, n_boot=50),
             figures.draw_best_vs_flops(groups, LONG_TITLE), figures.draw_best_vs_context(groups, LONG_TITLE),
             figures.draw_icl_over_training(runs, LONG_TITLE)]
    assert all(fig is not None for fig in drawn)
    for fig in drawn:
        whole(fig)
        pyplot().close(fig)


def test_every_results_figure_is_whole(tmp_path, kept, import_script):
    """scripts/plot_results.py's figures (bench_decode's and compare_train_paths' own among them), drawn from the
    committed records."""
    plot_results = import_script("plot_results")
    for table, plot in plot_results.PLOTS.items():
        plot(json.loads((RESULTS / f"{table}.json").read_text()), tmp_path / f"{table}.png")
        assert clipped_text(kept[-1]) == [], table


def test_the_scripts_own_figures_are_whole(tmp_path, kept, import_script):
    plot_runs = import_script("plot_runs")
    for name in (LONG_NAME, f"{LONG_NAME}_resumed"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "flops": 1e15 * s, "best_context_loss": 3.0 / s}) + "\n" for s in (1, 2, 3)))
    plot_runs.plot([tmp_path / LONG_NAME, tmp_path / f"{LONG_NAME}_resumed"], "flops", "best_context_loss",
                   tmp_path / "runs.png")
    whole(kept[-1])

    icl_recency = import_script("icl_recency")
    from longctx.data.icl_markov import recency_names
    names = recency_names(icl_recency.MAX_DIST)
    rows = [{"label": label, "attention": attention, "step": 6000, "blind": 2,
             "classes": {n: {"excess": 0.1 * i} for i, n in enumerate(names)}}
            for label, attention in ((LONG_NAME, "power_p2"), ("optimum blind to the newest 2", "bayes_blind"))]
    icl_recency.plot(rows, tmp_path / "recency.png", 4096)
    whole(kept[-1])

    bench_attention = import_script("bench_attention")
    rows = [dict(impl=impl, t=t, d=64, mode=mode, ms=1.0, mtok_per_s=t / 1e3) for impl in ("longctx_p2", "sdpa")
            for t in (1024, 65536) for mode in ("fwd", "fwdbwd")]
    bench_attention.plot(rows, tmp_path / "bench.png")
    whole(kept[-1])


def test_clipped_text_names_a_title_wider_than_the_figure():
    """The check itself: a title past both edges and an axis label past the bottom are named."""
    from longctx.plotting import new_figure
    fig, ax = pyplot().subplots(figsize=(3, 2))
    ax.set_title(LONG_TITLE)
    ax.set_xlabel("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk")
    assert clipped_text(fig) == [f"text {LONG_TITLE!r}", "x-axis 'a\\nb\\nc\\nd\\ne\\nf\\ng\\nh\\ni\\nj\\nk'"]
    pyplot().close(fig)
    fig, ax = new_figure((4, 3))
    ax.set_title(fill_title(LONG_TITLE, 3, 10), fontsize=10)  # the axes' width: the title is centred on them
    assert clipped_text(fig) == []
    pyplot().close(fig)


def test_legends_name_attentions_in_words():
    assert [attention_label(t) for t in ("exp", "power_p2", "window1024", "linear")] == [
        "softmax", "power p=2", "window 1024", "linear"]
    assert readable_label("power_p2, ctx=512 (3 seeds)") == "power p=2, ctx=512 (3 seeds)"
    assert readable_label("exp (2 seeds)") == "softmax (2 seeds)"
    assert readable_label("power_p4, p=4, optim.lr=0.001 (3 seeds)") == "power p=4, optim.lr=0.001 (3 seeds)"
    assert readable_label("window1024, window=1024, seed=1") == "window 1024, seed=1"   # the tag's words say it
    assert readable_label("power p=2") == "power p=2"                                 # a label given in words
