"""The report's figures. Each `draw_*` returns the matplotlib figure (tests read its lines and labels back);
`save` writes it. Colours and line styles: one pair per group of runs (runs differing only in seed share one,
drawn as their mean with a band); the Bayes optimum of each heldout data dashed in black, behind the runs.
Legends sit outside the axes, right of the plot, where they cannot cover a curve or an axis label (the figure
widens to hold them), and name the attention in words (longctx.plotting.readable_label: "power p=2, ctx=512", not
"power_p2, p=2, ctx=512")."""
from __future__ import annotations

import math

import numpy as np

from longctx.plotting import fill_title, new_figure, pyplot, readable_label, widen_for_legend
from longctx.report.runs import Group, Run, show, training_flops
from longctx.report.stats import DEFAULT_BOOTSTRAP, check_paired, paired_seed_difference, seed_aggregate

LINESTYLES = ["-", "--", "-.", ":"]
OPTIMUM_STYLES = ["--", (0, (5, 2, 1, 2)), ":", (0, (8, 3))]
SEED_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]  # the seeds of one group: one colour, a marker each
TITLE_INCHES = 6.4  # the axes' width in an 8-inch figure (the legend widens it)


def style(group: Group) -> dict:
    """The group's own colour and line style (cycles of 10 and 4: unique for the first 20 groups)."""
    return {"color": f"C{group.index % 10}", "linestyle": LINESTYLES[group.index % len(LINESTYLES)]}


def legend_outside(ax, **kw):
    if not ax.get_legend_handles_labels()[0]:
        return None
    legend = ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, **kw)
    widen_for_legend(ax.figure, legend)
    return legend


def centers(curve) -> list[float]:
    return [math.sqrt(max(a, 1) * b) for a, b, *_ in curve]


def _axes(ax, xlabel: str, ylabel: str, title: str, base: int = 10) -> None:
    ax.set_xscale("log", base=base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(fill_title(title, TITLE_INCHES, 10), fontsize=10)
    ax.grid(alpha=0.3, which="both")


def _when(budget: float | None) -> str:
    return "final evaluation" if budget is None else f"last evaluation within {budget:.3g} training FLOPs"


def group_curve(group: Group, budget: float | None, gap: bool, n_boot: int = DEFAULT_BOOTSTRAP):
    """(bins, mean curve over seeds, band low, band high, steps) at the chosen evaluation; the band is the bootstrap
    interval when every seed wrote per-document losses, else None. None when no seed reached the budget."""
    pairs = [(run, run.at_flops(budget)) for run in group.runs]
    pairs = [(run, rec) for run, rec in pairs if rec is not None and (not gap or "bayes_curve" in rec)]
    if not pairs:
        return None
    values = [np.array([v for *_, v in rec["icl_curve"]]) for _, rec in pairs]
    if gap:
        values = [v - np.array([b for *_, b in rec["bayes_curve"]]) for v, (_, rec) in zip(values, pairs)]
    mean = np.mean(values, axis=0)
    docs = [run.doc_bins(rec) for run, rec in pairs]
    low = high = None
    if all(d is not None and (not gap or d.bayes is not None) for d in docs):
        iv = seed_aggregate(docs, "gap_curve" if gap else "curve", n_boot)
        low, high = iv.low, iv.high
    return pairs[0][1]["icl_curve"], mean, low, high, sorted({rec["step"] for _, rec in pairs})


def _steps(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def _draw_groups(ax, groups: list[Group], budget, gap: bool, n_boot: int) -> bool:
    banded = False
    for group in groups:
        got = group_curve(group, budget, gap, n_boot)
        if got is None:
            continue
        bins, mean, low, high, steps = got
        xs = centers(bins)
        ax.plot(xs, mean, marker=".", lw=1.6, zorder=3, label=f"{readable_label(group.label)} ({_steps(steps)})",
                **style(group))
        if low is not None:
            ax.fill_between(xs, low, high, color=style(group)["color"], alpha=0.2, lw=0, zorder=2)
            banded = True
    return banded


def optima(runs: list[Run], budget: float | None) -> list[tuple[str, list]]:
    """[(label, bayes_curve)] one per heldout data (runs grouped by their data config and context), labelled by
    what tells the data apart when there are several."""
    by_key: dict[tuple, list] = {}
    for run in runs:
        rec = run.at_flops(budget)
        if rec is not None and "bayes_curve" in rec:
            by_key.setdefault(run.heldout_key, rec["bayes_curve"])
    keys = list(by_key)
    if len(keys) == 1:
        return [("Bayes-optimal", by_key[keys[0]])]
    out = []
    for key in keys:
        ctx, items = key[0], dict(key[1:])
        differ = [f"{k}={show(k, v)}" for k, v in items.items()
                  if any(dict(other[1:]).get(k) != v for other in keys)]
        if any(other[0] != ctx for other in keys):
            differ.insert(0, f"ctx {ctx}")
        out.append((f"Bayes-optimal ({', '.join(differ)})", by_key[key]))
    return out


def _draw_optima(ax, runs, budget, gap: bool = False) -> None:
    if gap:
        return
    for i, (label, curve) in enumerate(optima(runs, budget)):
        ax.plot(centers(curve), [v for *_, v in curve], color="black", linestyle=OPTIMUM_STYLES[i % 4], lw=1.2,
                zorder=1, label=label)


def _band_note(banded: bool) -> str:
    return ("; bands: 95% bootstrap interval over documents" if banded
            else "; no per-document records: no intervals")


def draw_icl_overlay(groups: list[Group], runs: list[Run], title: str, budget: float | None = None,
                     n_boot: int = DEFAULT_BOOTSTRAP):
    fig, ax = new_figure((8, 5))
    banded = _draw_groups(ax, groups, budget, False, n_boot)
    _draw_optima(ax, runs, budget)
    _axes(ax, "position in context (tokens, log scale; bin centres)", "heldout loss (nats/token)",
          f"{title}\nICL curves ({_when(budget)}{_band_note(banded)})")
    legend_outside(ax)
    return fig


def gap_curve(record: dict) -> list[tuple[int, int, float]]:
    """[(bin_start, bin_end, loss - Bayes-optimal loss), ...] of one evaluation; [] without a known optimum."""
    return [(a, b, loss - best) for (a, b, loss), (*_, best) in zip(record["icl_curve"],
                                                                       record.get("bayes_curve", []))]


def draw_gap_to_optimum(groups: list[Group], title: str, budget: float | None = None,
                        n_boot: int = DEFAULT_BOOTSTRAP, target: float = 0.05):
    fig, ax = new_figure((8, 5))
    banded = _draw_groups(ax, groups, budget, True, n_boot)
    ax.axhline(target, color="black", linestyle="--", lw=1, zorder=1, label=f"{target} nats above the optimum")
    ax.axhline(0.0, color="black", lw=0.8, zorder=1)
    _axes(ax, "position in context (tokens, log scale; bin centres)",
          "heldout loss minus Bayes-optimal loss (nats/token)",
          f"{title}\ngap to the optimum ({_when(budget)}{_band_note(banded)})")
    legend_outside(ax)
    return fig


def paired_curves(groups: list[Group], n_boot: int = DEFAULT_BOOTSTRAP) -> list[tuple[Group, Group, object]]:
    """[(group, reference, Interval per bin)]: each group's final ICL curve minus the first group's on the same
    heldout data, paired on the documents (groups without per-document records, or on other documents, left out)."""
    out, refs = [], {}
    for group in groups:
        docs = [run.doc_bins(run.final) for run in group.runs]
        if any(d is None for d in docs):
            continue
        key = group.first.heldout_key
        if key not in refs:
            refs[key] = (group, docs)
            continue
        ref, ref_docs = refs[key]
        try:
            for d in docs:
                check_paired(ref_docs[0], d, ref.label, group.label)
        except ValueError:
            continue  # listed in the report's paired table as refused
        out.append((group, ref, paired_seed_difference(docs, ref_docs, "curve", group.label, ref.label, n_boot)))
    return out


def draw_paired_differences(groups: list[Group], title: str, n_boot: int = DEFAULT_BOOTSTRAP):
    """Per bin: each group's loss minus the reference's (the first group on the same heldout documents), with
    its paired 95% interval; an interval clear of 0 separates the two. None when no pair has the records."""
    pairs = paired_curves(groups, n_boot)
    if not pairs:
        return None
    fig, ax = new_figure((8, 5))
    for group, ref, iv in pairs:
        xs = centers(group.first.final["icl_curve"])
        ax.plot(xs, iv.estimate, marker=".", lw=1.6, zorder=3,
                label=f"{readable_label(group.label)} minus {readable_label(ref.label)}", **style(group))
        ax.fill_between(xs, iv.low, iv.high, color=style(group)["color"], alpha=0.2, lw=0, zorder=2)
    ax.axhline(0.0, color="black", lw=0.8, zorder=1)
    _axes(ax, "position in context (tokens, log scale; bin centres)", "loss difference (nats/token)",
          f"{title}\npaired differences per bin (final evaluation; bands: 95% paired bootstrap interval)")
    legend_outside(ax)
    return fig


def draw_best_vs_flops(groups: list[Group], title: str):
    """Best-context loss through training, every seed its own line in its group's colour and line style, told
    apart by its marker and its own legend entry (seeds' lines cross); None when no record holds its training
    FLOPs (records older than the FLOP count)."""
    if not any("flops" in r for g in groups for run in g.runs for r in run.records):
        return None
    fig, ax = new_figure((8, 5))
    for group in groups:
        for i, run in enumerate(group.runs):
            points = [(training_flops(r), r["best_context_loss"]) for r in run.records if "flops" in r]
            if points:
                label = readable_label(run.label if group.n_seeds > 1 else group.label)
                ax.plot(*zip(*points), marker=SEED_MARKERS[i % len(SEED_MARKERS)], ms=4, lw=1.4, label=label,
                        **style(group))
    _axes(ax, "training FLOPs, every stage (3x forward, charged with the form that runs; log scale)",
          "heldout best-context loss (nats/token)", f"{title}\nbest-context loss per FLOP")
    legend_outside(ax)
    return fig


def context_lines(groups: list[Group]) -> dict[str, list[Group]]:
    """Groups that differ only in ctx, joined into one line each (keyed by the label without ctx)."""
    lines: dict[str, list[Group]] = {}
    for group in groups:
        key = ", ".join(p for p in group.label.split(", ") if not p.startswith("ctx="))
        lines.setdefault(key, []).append(group)
    return lines


def draw_best_vs_context(groups: list[Group], title: str):
    """Final best-context loss against the training context (seed mean, seeds as error bars of their range);
    None when the runs span fewer than two contexts (a one-point plot says nothing)."""
    if len({g.first.ctx for g in groups}) < 2:
        return None
    fig, ax = new_figure((8, 5))
    for key, members in context_lines(groups).items():
        members = sorted(members, key=lambda g: g.first.ctx)
        xs = [g.first.ctx for g in members]
        finals = [[r.final["best_context_loss"] for r in g.runs] for g in members]
        mean = [float(np.mean(f)) for f in finals]
        err = np.array([[m - min(f), max(f) - m] for m, f in zip(mean, finals)]).T
        ax.errorbar(xs, mean, yerr=err if err.any() else None, marker="o", lw=1.4, capsize=3,
                    label=readable_label(key), **style(members[0]))
    _axes(ax, "training context (tokens, log scale)", "final heldout best-context loss (nats/token)",
          f"{title}\nbest-context loss vs context", base=2)
    legend_outside(ax)
    return fig


def draw_icl_over_training(runs: list[Run], title: str):
    plt = pyplot()
    cols = min(3, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = new_figure((4.4 * cols, 3.6 * rows), nrows=rows, ncols=cols, squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, run in zip(axes.flat, runs):
        steps = [rec["step"] for rec in run.records]
        for i, rec in enumerate(run.records):
            ax.plot(centers(rec["icl_curve"]), [v for *_, v in rec["icl_curve"]], lw=1.2, zorder=2,
                    color=cmap(i / max(1, len(run.records) - 1)))
        if "bayes_curve" in run.final:
            ax.plot(centers(run.final["bayes_curve"]), [v for *_, v in run.final["bayes_curve"]], "k--", lw=1,
                    zorder=1, label="Bayes-optimal")
            ax.legend(fontsize=6, loc="upper right")
        ax.set_xscale("log")
        ax.set_title(fill_title(f"{readable_label(run.label)}\n(steps {steps[0]}-{steps[-1]}: dark to light)", 3.4, 7),
                     fontsize=7)
        ax.set_xlabel("position (tokens, log)", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    for ax in axes[:, 0]:
        ax.set_ylabel("heldout loss (nats/token)", fontsize=8)
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    fig.suptitle(fill_title(f"{title}: ICL curves through training", 4.4 * cols - 0.4, 10), fontsize=10)
    return fig
