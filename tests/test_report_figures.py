"""The report's figures read back: every run its own colour and line style, each its label; legends clear of the
x-axis label; seeds drawn as a band; no one-point 'vs context' plot; plot_icl_curves' final curve on top."""
from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from report_fixtures import fake_run

from longctx.plotting import readable_label
from longctx.report import figures, label_runs, load_run, main
from longctx.report.runs import group_runs


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _legend_clear_of_xlabel(fig) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not ax.get_xlabel():
            continue
        assert not _overlap(legend.get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer))
        assert not _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))  # outside the axes


@pytest.fixture
def runs(tmp_path):
    made = [load_run(fake_run(tmp_path / f"{att}_{ctx}", att, ctx, off, doc_bins=True))
            for att, ctx, off in [("exp", 512, 0.1), ("exp", 1024, 0.1), ("power", 512, 0.05),
                                  ("power", 1024, 0.05)]]
    made += [load_run(fake_run(tmp_path / f"power_s{s}", "power", 512, 0.05, seed=s, doc_bins=True)) for s in (1, 2)]
    label_runs(made)
    return made


def test_each_group_its_own_style_and_label_and_legends_outside(runs):
    groups = group_runs(runs)
    assert len(groups) == 4 and groups[2].n_seeds == 3       # power ctx 512: seeds 0, 1, 2
    styles = {(figures.style(g)["color"], figures.style(g)["linestyle"]) for g in groups}
    assert len({c for c, _ in styles}) == 4 and len({s for _, s in styles}) == 4  # runs differing only in ctx too
    fig = figures.draw_icl_overlay(groups, runs, "t", n_boot=100)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    for group in groups:
        (label,) = [k for k in lines if k.startswith(readable_label(group.label) + " (step")]
        means = np.mean([[v for *_, v in r.final["icl_curve"]] for r in group.runs], axis=0)
        np.testing.assert_allclose(lines[label].get_ydata(), means)
        assert lines[label].get_color() == figures.style(group)["color"]
    assert len(fig.axes[0].collections) == 4                  # a band per group (each has per-document records)
    _legend_clear_of_xlabel(fig)
    gap = figures.draw_gap_to_optimum(groups, "t", n_boot=100)
    _legend_clear_of_xlabel(gap)
    _legend_clear_of_xlabel(figures.draw_best_vs_flops(groups, "t"))
    by_ctx = figures.draw_best_vs_context(groups, "t")
    assert sorted(t.get_text() for t in by_ctx.axes[0].get_legend().get_texts()) == ["power p=2", "softmax"]
    _legend_clear_of_xlabel(by_ctx)


def test_seeds_in_the_flops_figure_are_told_apart(runs):
    """Best-context loss per FLOP: a group's seeds share its colour and line style, each with its own marker and
    legend entry naming its seed, its line its own records' numbers."""
    groups = group_runs(runs)
    fig = figures.draw_best_vs_flops(groups, "t")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    seeds = groups[2].runs
    names = [f"power p=2, ctx=512, seed={run.seed}" for run in seeds]
    assert legend == ["softmax, ctx=512", "softmax, ctx=1024", *names, "power p=2, ctx=1024"]
    assert len({lines[n].get_marker() for n in names}) == 3
    assert {(lines[n].get_color(), lines[n].get_linestyle()) for n in names} == {
        (figures.style(groups[2])["color"], "-.")}
    for name, run in zip(names, seeds):
        assert list(lines[name].get_ydata()) == [r["best_context_loss"] for r in run.records]
        assert list(lines[name].get_xdata()) == [r["flops"] for r in run.records]


def test_the_band_is_the_seed_aggregate_interval(runs):
    from longctx.report.stats import seed_aggregate
    group = group_runs(runs)[2]
    _, mean, low, high, steps = figures.group_curve(group, None, gap=True, n_boot=200)
    iv = seed_aggregate([r.doc_bins(r.final) for r in group.runs], "gap_curve", 200)
    np.testing.assert_allclose(low, iv.low)
    np.testing.assert_allclose(high, iv.high)
    np.testing.assert_allclose(mean, iv.estimate, atol=1e-6)   # the records' mean equals the documents' mean


def test_one_context_draws_no_vs_context_plot(tmp_path):
    fake_run(tmp_path / "a", "exp", 512, 0.1)
    fake_run(tmp_path / "b", "power", 512, 0.1)
    text = main([str(tmp_path), "--out", str(tmp_path / "out")]).read_text()
    assert not (tmp_path / "out" / "best_context_vs_context.png").exists()
    assert "No best-context loss vs context figure: the runs span one context (512)" in text


def test_plot_icl_curves_draws_the_final_curve_over_the_optimum(tmp_path):
    from longctx.train.loggers import plot_icl_curves
    run = fake_run(tmp_path / "r", "exp", 512, 0.1, steps=(10, 20, 30))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    import matplotlib.pyplot as plt
    saved = {}
    real_close = plt.close
    plt.close = lambda fig=None: saved.setdefault("fig", fig)  # keep the figure to read it back
    try:
        plot_icl_curves(records, tmp_path / "icl.png", "t")
    finally:
        plt.close = real_close
    lines = {line.get_label(): line for line in saved["fig"].axes[0].get_lines()}
    final, optimum = lines["step 30 (final)"], lines["Bayes-optimal"]
    np.testing.assert_allclose(final.get_ydata(), [v for *_, v in records[-1]["icl_curve"]])
    others = [line for line in saved["fig"].axes[0].get_lines() if line not in (final, optimum)]
    assert final.get_zorder() > optimum.get_zorder() and final.get_zorder() > max(o.get_zorder() for o in others)
    assert final.get_linewidth() >= 2 * optimum.get_linewidth()
    assert final.get_linewidth() > max(o.get_linewidth() for o in others)
    # a distinct colour: far from the optimum's black and from every earlier evaluation's
    rgb = np.array(to_rgb(final.get_color()))
    assert all(np.abs(rgb - np.array(to_rgb(o.get_color()))).sum() > 0.5 for o in others + [optimum])
    assert (tmp_path / "icl.png").read_bytes()[:4] == b"\x89PNG"
    real_close(saved["fig"])


def test_paired_differences_figure_and_intervals_json(runs, tmp_path):
    """The paired figure draws, per bin, each group minus the first on the same documents with the paired
    interval; intervals.json holds the same numbers as the statistics module."""
    from longctx.report.stats import paired_seed_difference, seed_aggregate
    groups = group_runs(runs)
    fig = figures.draw_paired_differences(groups, "t", n_boot=100)
    shown = {line.get_label(): line.get_ydata() for line in fig.axes[0].get_lines()
             if not line.get_label().startswith("_")}
    ref = groups[0]                                           # exp ctx 512: the power ctx-512 seeds pair with it
    power = groups[2]
    docs = lambda g: [r.doc_bins(r.final) for r in g.runs]  # noqa: E731
    iv = paired_seed_difference(docs(power), docs(ref), "curve", n_boot=100)
    words = readable_label
    np.testing.assert_allclose(shown[f"{words(power.label)} minus {words(ref.label)}"], iv.estimate)
    assert set(shown) == {f"{words(g.label)} minus {words(groups[0].label)}" for g in groups[2:3]} | {
        f"{words(groups[3].label)} minus {words(groups[1].label)}"}  # ctx 1024: power minus exp, on their own bins
    _legend_clear_of_xlabel(fig)
    main([str(tmp_path), "--out", str(tmp_path / "out"), "--bootstrap", "100"])
    saved = json.loads((tmp_path / "out" / "intervals.json").read_text())
    entry = next(g for g in saved["groups"] if g["label"] == power.label)
    agg = seed_aggregate(docs(power), "gap_curve", 100)
    np.testing.assert_allclose(entry["gap_curve"]["low"], agg.low)
    assert entry["gap_curve"]["n_seeds"] == 3 and len(entry["bins"]) == len(agg.low)
    assert (tmp_path / "out" / "paired_differences.png").exists()
