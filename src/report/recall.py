"""The report's recall section (runs on recall data, `data=mqar`): accuracy at the queries per group of seeds with
its interval, and paired differences between groups evaluated on the same heldout documents.

Each run's final per-document record holds `hits` (n_docs, n_queries); a document's accuracy is its mean. The
intervals reuse the loss statistics' bootstrap (`longctx.report.stats`) on a one-bin record whose "loss" is each
document's accuracy: seed means over joint resamples of the documents, paired differences on the same resamples.
Seed-level intervals (Welch's t over the seeds' own accuracies, `longctx.report.verdict`) stand beside them.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from itertools import combinations

import numpy as np

from longctx.plotting import fill_title, new_figure
from longctx.report.markdown import table_head
from longctx.report.runs import Group, Run, read_metrics, run_stages
from longctx.report.stats import DocBins, paired_seed_difference, seed_aggregate
from longctx.report.verdict import t_quantile, welch_interval
from longctx.state import state_per_layer
from longctx.train.stop_when import parse_stop_when

# each attention in words, as the recall-vs-state figure's legend names it (a window's points differ by w, power's
# by p: one line each, each point labelled)
FAMILIES = {"exp": "softmax (KV cache of the context)", "window": "sliding window (w tokens)",
            "linear": "linear attention", "power": "power attention (degree p)"}
# the recall recipe's first-stage bound (experiment=recall_state's first_stop: recall_accuracy>=0.99), for records
# whose points hold their first stages' recall but not whether each met its bound (`first_stage_met`)
RECIPE_FIRST_STOP = 0.99
# the recall recipe's last stage, its updates (experiment=recall_state's trainer.max_steps): a staged point whose last
# stage ran another number records it (`updates`) and is drawn in a panel of its own
RECIPE_UPDATES = 600
# arms that depart from their family's recipe without changing its state, each a line of its own: (record key, note
# beside a point, words in the legend)
VARIANTS = (("output_norm", "+norm", "per-head output norm"), ("ungated", "ungated", "no gate"))


def run_hits(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """(hits (n_docs, n_queries), doc_index) of the run's final evaluation: whether each query was recalled, per
    heldout document (None: no recall record)."""
    name = run.final.get("doc_bins")
    if "recall_accuracy" not in run.final or not name:
        return None
    path, _, prefix = str(name).partition("#")
    path = run.path / path
    doc_index = run.doc_bins(run.final).doc_index  # reads and checks the record (a cut file is named)
    with np.load(path, allow_pickle=False) as f:
        if prefix + "hits" not in f.files:
            return None
        hits = f[prefix + "hits"]
    if hits.ndim != 2 or hits.shape[0] != doc_index.shape[0]:
        raise ValueError(f"{path}: hits {hits.shape} do not match doc_index {doc_index.shape}")
    return hits, np.asarray(doc_index, np.int64)


def accuracy_docs(run: Run) -> DocBins | None:
    """The run's final evaluation as a one-bin record of per-document accuracy (None: no recall record)."""
    found = run_hits(run)
    if found is None:
        return None
    hits, doc_index = found
    return DocBins(loss=hits.mean(axis=1, dtype=np.float64)[:, None], edges=np.asarray([[0, run.ctx]]),
                   doc_index=doc_index)


def first_stage_end(run: Run) -> tuple[float, int, bool | None] | None:
    """(recall, update, met) of its first stage's last evaluation, for a stage of a staged run (trainer.stages) after
    the first: a seed that never left chance there is an optimization failure, not a state limit, and the update says
    whether the stage stopped at its bound or ran all its updates. met: whether that evaluation met the first stage's
    trainer.stop_when (in stages.json); None where the stage had no bound. A seed whose first stage did not meet it
    never learned what that stage teaches (a failed optimization, or a state too small for the stage's own pairs):
    its recall after the stage is not the recipe's measure of its state. None for a plain run or a first stage
    without a recall record."""
    stages = run_stages(run.path)
    if len(stages) < 2 or run.path.name == stages[0]["dir"]:
        return None
    metrics = run.path.parent / stages[0]["dir"] / "metrics.jsonl"
    if not metrics.is_file():
        return None
    ends = [r for r in read_metrics(metrics) if "recall_accuracy" in r]
    if not ends:
        return None
    last = ends[-1]
    try:
        overrides = stages[0].get("overrides")
        stop = parse_stop_when(overrides.get("trainer.stop_when") if isinstance(overrides, dict) else None)
    except ValueError:
        stop = None
    met = None if stop is None or stop.metric not in last else stop.met(last)
    return float(last["recall_accuracy"]), int(last["step"]), met


def first_stage_failed(point: dict) -> list[bool]:
    """Per seed of a recall point: its first stage ended short of its stop bound (the record's `first_stage_met`).
    A point recorded without that field but with its first stages' recall ran the recall recipe, whose bound is
    RECIPE_FIRST_STOP; a point without first stages failed none."""
    met = point.get("first_stage_met")
    if met is not None:
        return [m is False for m in met]
    return [r is not None and r < RECIPE_FIRST_STOP for r in point.get("first_stage") or [None] * len(point["seeds"])]


def run_state(run: Run) -> int | None:
    """Floats of state one layer holds for one sequence at the run's context, by the paper's definition
    (`longctx.state.state_per_layer`: power's D = C(d+p-1, p)); None when the config does not say (an old record)."""
    attention, model = run.config.get("attention") or {}, run.config.get("model") or {}
    try:
        return state_per_layer(attention.get("name"), d_model=int(model["d_model"]), n_heads=int(model["n_heads"]),
                               ctx=run.ctx, p=int(attention.get("p") or 2), window=attention.get("window"))
    except (KeyError, TypeError, ValueError):
        return None


def recall_points(groups: list[Group]) -> list[dict]:
    """One point per group whose runs measured recall at a known state: what the recall-vs-state figure draws and
    the compact record keeps (each seed's own accuracy, so the figure's seed-level interval redraws from it).

    Groups that differ only in their learning rate are one point at its best rate (zoology's protocol: each mixer at
    its own best rate), chosen by the seeds' mean accuracy on the same heldout documents the point reports -- an
    optimistic pick, so the point keeps every rate tried (`lrs`) and the figure says it is a best-of."""
    candidates: dict[tuple, list[dict]] = {}
    for g in groups:
        docs = [accuracy_docs(r) for r in g.runs]
        state = run_state(g.first)
        if state is None or any(d is None for d in docs):
            continue
        attention = g.first.config["attention"]
        point = {"label": g.label, "attention": attention["name"], "tag": g.first.tag,
                 "p": attention.get("p"), "window": attention.get("window"), "state": state,
                 "n_pairs": (g.first.config.get("data") or {}).get("n_pairs"), "ctx": g.first.ctx,
                 "chance": g.first.final.get("recall_chance"), "lr": g.first.flat.get("optim.lr"),
                 "d_model": (g.first.config.get("model") or {}).get("d_model"),
                 "seeds": [float(d.loss.mean()) for d in docs], "runs": [r.name for r in g.runs]}
        if attention.get("output_norm"):  # a variant of its arm (same state): a line of its own
            point["output_norm"] = True
        if attention.get("gating") is False:  # a gated family (power, linear) without its gate: the same state
            point["ungated"] = True
        by_distance = [r.final.get("recall_by_distance") for r in g.runs]
        if all(b for b in by_distance):
            point["by_distance"] = by_distance  # each seed's [[from, to, accuracy, queries], ...] (metrics.jsonl)
        first = [first_stage_end(r) for r in g.runs]
        if any(f is not None for f in first):
            point["first_stage"] = [None if f is None else f[0] for f in first]
            point["first_stage_steps"] = [None if f is None else f[1] for f in first]
            point["first_stage_met"] = [None if f is None else f[2] for f in first]
            updates = g.first.flat.get("trainer.max_steps")
            if updates is not None and int(updates) != RECIPE_UPDATES:  # a longer or shorter last stage
                point["updates"] = int(updates)
        but_rate = tuple(item for item in g.first.group_key if item[0] != "optim.lr")
        candidates.setdefault(but_rate, []).append(point)
    return [best_of_rates(tried) if len(tried) > 1 else tried[0] for tried in candidates.values()]


def best_of_rates(tried: list[dict]) -> dict:
    """One point for points of one arm, N, context and width at several rates: the highest seed mean, with every rate
    tried in `lrs` and the other rates' points, whole, in `other_rates` (a member already picked among rates brings its
    own `lrs` and `other_rates`)."""
    best = max(tried, key=lambda p: float(np.mean(p["seeds"])))
    rates = sorted({r for p in tried for r in p.get("lrs", [p.get("lr")]) if r is not None})
    others = [q for p in tried if p is not best
              for q in [{k: v for k, v in p.items() if k != "other_rates"}, *p.get("other_rates", [])]]
    return {**best, "lrs": rates, "other_rates": best.get("other_rates", []) + others}


# what a point is but its rate: points equal in these and apart in `lr` are one point tried at several rates
BUT_RATE = ("attention", "tag", "p", "window", "state", "n_pairs", "ctx", "d_model", "output_norm", "ungated",
            "updates")


def best_rates(points: list[dict]) -> list[dict]:
    """Points of one arm, N, context and width at several rates, reported apart (parts of a record carried into
    one), as one point at its best rate, as recall_points picks within a report (best_of_rates: the record keeps what
    the other rates measured; the figure draws the best), in the place of the first of them. Points of one rate are
    left as they are."""
    tried: dict[tuple, list[int]] = {}
    for i, point in enumerate(points):
        tried.setdefault(tuple(point.get(key) for key in BUT_RATE), []).append(i)
    out = list(points)
    for members in tried.values():
        if len({points[i].get("lr") for i in members}) < 2:
            continue
        out[members[0]] = best_of_rates([points[i] for i in members])
        for i in members[1:]:
            out[i] = None
    return [p for p in out if p is not None]


def point_key(point: dict) -> str:
    """A point's label without its seed count (group_runs appends " (k seeds)")."""
    return re.sub(r" \(\d+ seeds\)$", "", point["label"])


# what must agree for two points to be seeds of one (the per-seed lists are joined): the point and its rate
SAME_POINT = BUT_RATE + ("chance", "lr")
PER_SEED = ("seeds", "runs", "first_stage", "first_stage_steps", "first_stage_met", "by_distance")


def merge_seeds(old: dict, new: dict, seeds: dict) -> dict:
    """A carried recall point with a later report's runs of the same point added as more seeds (--add-seeds). seeds:
    run name -> seed, carried and new. A carried point picked among rates (`lrs`) takes seeds at the rate it was
    drawn at (`lr`), and keeps its `lrs`. ValueError when the two are not one point (a field of SAME_POINT differs, or
    the new runs were picked among rates themselves) or share a seed."""
    differ = [key for key in SAME_POINT if old.get(key) != new.get(key)]
    if differ or "lrs" in new:
        what = f"{differ[0]} {old.get(differ[0])!r} vs {new.get(differ[0])!r}" if differ else "a best-of-rates pick"
        raise ValueError(f"--add-seeds: recall point {point_key(new)!r}: not more seeds of the carried point ({what})")
    shared = {seeds.get(name) for name in old["runs"]} & {seeds.get(name) for name in new["runs"]}
    if shared:
        raise ValueError(f"--add-seeds: recall point {point_key(new)!r}: seed {sorted(shared, key=str)[0]} is "
                         f"already among the carried point's seeds")
    if ("first_stage" in old) != ("first_stage" in new):
        raise ValueError(f"--add-seeds: recall point {point_key(new)!r}: not more seeds of the carried point (one "
                         f"side trained a first stage, the other not)")
    merged = {key: value for key, value in old.items() if key not in PER_SEED}
    for key in PER_SEED:
        parts = [_per_seed(point, key) for point in (old, new)]
        if all(part is not None for part in parts):
            merged[key] = parts[0] + parts[1]
    merged["label"] = f"{point_key(new)} ({len(merged['seeds'])} seeds)"
    return merged


def _per_seed(point: dict, key: str) -> list | None:
    """A point's per-seed list; a record written before `first_stage_met` existed met its bound by RECIPE_FIRST_STOP."""
    if key == "first_stage_met" and key not in point and point.get("first_stage") is not None:
        return [None if r is None else r >= RECIPE_FIRST_STOP for r in point["first_stage"]]
    return point.get(key)


def seed_interval(values) -> tuple[float, float, float]:
    """Mean and 95% t interval over the seeds (n - 1 degrees of freedom), cut to [0, 1] where an accuracy lies (a
    seed that failed beside two that learned spans more than the whole range); a single seed: no interval."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, mean, mean
    half = t_quantile(0.975, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, max(mean - half, 0.0), min(mean + half, 1.0)


def _variant(point: dict) -> tuple:
    """Which of the VARIANTS a point runs (all False: its family's recipe)."""
    return tuple(bool(point.get(key)) for key, _, _ in VARIANTS)


def _arm_note(point: dict) -> str:
    note = {"power": f"p={point['p']}", "window": f"w={point['window']}"}.get(point["attention"], "")
    marks = [mark for (key, mark, _), on in zip(VARIANTS, _variant(point)) if on]
    return " ".join(x for x in (note + "".join(m for m in marks if m.startswith("+")),
                                *(m for m in marks if not m.startswith("+"))) if x)


def _arm(point: dict) -> tuple:
    """The attention a point runs, whatever the model's width (each of the VARIANTS is an arm of its own)."""
    return (point["attention"], point.get("p"), point.get("window")) + _variant(point)


def _variant_lines(points_of: list[dict]) -> list[list[dict]]:
    """A family's points as lines: the plain arms, then each variant in turn (absent ones left out)."""
    lines = [[p for p in points_of if _variant(p) == v] for v in dict.fromkeys([_variant({}),
                                                                               *sorted(map(_variant, points_of))])]
    return [line for line in lines if line]


def _line_label(family: str, line: list[dict]) -> str:
    return ", ".join([FAMILIES[family]] + [words for (_, _, words), on in zip(VARIANTS, _variant(line[0])) if on])


def _panel(point: dict) -> tuple:
    """The figure's panel of a point: its N, context and last stage's updates (None: the recipe's)."""
    return point["n_pairs"], point.get("ctx"), point.get("updates")


def _main_width(here: list[dict]):
    """The width most of these points share (the recipe's), drawn as the solid lines; None where all share one."""
    widths = Counter(p.get("d_model") for p in here)
    return widths.most_common(1)[0][0] if len(widths) > 1 else None


MIN_BIN_QUERIES = 16  # a distance bin of fewer queries a seed is left out (a handful of queries is not an accuracy)


def shared_distance_bins(seeds: list | None) -> list | None:
    """The seeds' [from, to] distance bins (each seed's recall_by_distance) when every seed recorded the same ones,
    else None: only then do their per-bin accuracies average."""
    if not seeds or not all(seeds):
        return None
    bins = [b[:2] for b in seeds[0]]
    return bins if all([b[:2] for b in s] == bins for s in seeds) else None


def draw_chance(ax, here: list[dict], label: str | None = None) -> None:
    """A dotted line at each chance level of these points (one value in n_values), the first one labelled."""
    chance = sorted({p["chance"] for p in here if p["chance"] is not None})
    for c in chance:
        ax.axhline(c, color="k", ls=":", lw=1, label=label if c == chance[0] else None)


def distance_curve(point: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(bin centres, seed mean, seed min, seed max) of a point's recall by distance from pair to query, over the bins
    that held MIN_BIN_QUERIES queries in every seed; None when its seeds' bins differ or were not recorded."""
    seeds = point.get("by_distance")
    if shared_distance_bins(seeds) is None:
        return None
    held = [i for i, b in enumerate(seeds[0]) if all(s[i][3] >= MIN_BIN_QUERIES for s in seeds)]
    if not held:
        return None
    acc = np.array([[s[i][2] for i in held] for s in seeds], dtype=np.float64)
    centre = np.array([math.sqrt(max(seeds[0][i][0], 1) * seeds[0][i][1]) for i in held])
    return centre, acc.mean(axis=0), acc.min(axis=0), acc.max(axis=0)


def _draw_by_distance(ax, here: list[dict], families: list[str]) -> None:
    """One line per point (its family's colour, a line style per p or w): recall by distance, seed mean with the
    seeds' range shaded -- where a window's state ends, its recall falls to chance."""
    styles = ("-", "--", ":", "-.")
    for i, family in enumerate(families):
        line = sorted((p for p in here if p["attention"] == family), key=lambda p: p["state"])
        for k, point in enumerate(line):
            curve = distance_curve(point)
            if curve is None:
                continue
            x, mean, low, high = curve
            name = " ".join(part for part in (FAMILIES[family].split(" (")[0], _arm_note(point)) if part)
            ax.plot(x, mean, styles[k % len(styles)], marker=".", color=f"C{i}", lw=1.2, label=name)
            ax.fill_between(x, low, high, color=f"C{i}", alpha=0.12, lw=0)
    draw_chance(ax, here)
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("distance from pair to query (tokens, log scale)", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="lower left")


def _panels(points: list[dict]) -> list[tuple[tuple, list[dict], bool, object]]:
    """[((N, context, updates), its points, across widths, main width)]: one panel per N, context and last stage's
    updates at the width most of its points share (main width: None where all share one), then, where some arms also
    ran at other model widths, a panel of those arms across every width they ran at (state grows with the heads)."""
    keys = sorted({_panel(p) for p in points}, key=lambda k: (k[1] or 0, k[0] is None, k[0] or 0, k[2] or 0))
    out = []
    for key in keys:
        here = [p for p in points if _panel(p) == key]
        main = _main_width(here)
        out.append((key, [p for p in here if main is None or p.get("d_model") == main], False, main))
        if main is not None:
            # arms that ran at several widths, and those that ran only away from the main width (drawn nowhere else)
            several = {arm for arm, n in Counter(_arm(p) for p in here).items() if n > 1}
            out.append((key, [p for p in here if _arm(p) in several or p.get("d_model") != main], True, main))
    return out


def _draw_seeds(ax, points_of: list[dict], color: str) -> None:
    """Each seed beside its point's mean (x): a seed that failed to train pulls the mean down, and shows here; one
    whose first stage ended short of its bound is an open triangle (it never learned what that stage teaches, from
    a failed optimization or a state too small for the stage's own pairs, as a window of 32 tokens for 16 pairs at
    ctx 64: either way its recall after the stage is not the recipe's measure of its state)."""
    if not (any(len(p["seeds"]) > 1 for p in points_of) or any(any(first_stage_failed(p)) for p in points_of)):
        return
    seeds = [(p["state"], a, bad) for p in points_of for a, bad in zip(p["seeds"], first_stage_failed(p))]
    for bad, marker in ((False, "x"), (True, "v")):
        xy = [(x, y) for x, y, b in seeds if b == bad]
        if xy:
            ax.scatter(*zip(*xy), marker=marker, s=22 if bad else 18, lw=0.9, zorder=3, alpha=0.7,
                       **({"facecolors": "none", "edgecolors": color} if bad else {"color": color}))


def _draw_errorbars(ax, line: list[dict], color: str, label, ls: str = "-"):
    stats = [seed_interval(p["seeds"]) for p in line]
    mean = [m for m, _, _ in stats]
    err = np.array([[m - lo, hi - m] for m, lo, hi in stats]).T
    ax.errorbar([p["state"] for p in line], mean, yerr=err if err.any() else None, marker="o", capsize=3, lw=1.3,
                color=color, ls=ls, label=label)
    return mean


def draw_recall_vs_state(points: list[dict], title: str):
    """Accuracy at the queries against the state one layer holds (log scale), one panel per number of pairs N (and
    context, where the points span several) and one line per attention family (across its p or w, at the width most
    points share); where arms also ran at other model widths, a panel beside of each such arm across its widths (one
    line an arm, each point labelled with its width). Seed means with 95% t intervals over the seeds (none for a
    single seed), each seed marked (a seed whose first stage never met its bound: an open triangle), chance dotted.
    Where the points recorded recall by distance, a second row draws it (the recall analogue of the ICL curve) for
    each point of a panel at one width. None when no point is known."""
    if not points:
        return None
    panels = _panels(points)
    contexts = len({key[1] for key, *_ in panels}) > 1
    by_distance = any(distance_curve(p) is not None for p in points)
    rows = 2 if by_distance else 1
    # one state axis for every panel of a row: N's panels compare at a glance, and a panel of a narrow range keeps
    # whole decades
    fig, axes = new_figure((4.6 * len(panels), 4.2 * rows), nrows=rows, ncols=len(panels), squeeze=False,
                           sharey="row", sharex="row")
    families = [f for f in FAMILIES if any(p["attention"] == f for p in points)]
    if by_distance:
        for ax, (_, here, widths, _) in zip(axes[1], panels):
            if widths:   # a line per arm and width is past reading: the report tables them
                ax.set_axis_off()
                ax.text(0.5, 0.5, "recall by distance at each width:\nthe report's table", ha="center",
                        va="center", fontsize=8, transform=ax.transAxes)
            else:
                _draw_by_distance(ax, here, families)
        axes[1, 0].set_ylabel("accuracy at the queries, by distance")
    for ax, ((n_pairs, ctx, updates), here, widths, main) in zip(axes[0], panels):
        for i, family in enumerate(families):
            points_of = sorted((p for p in here if p["attention"] == family), key=lambda p: p["state"])
            if not points_of:
                continue
            if not widths:   # the family across its arms (p or w), each variant's arms beside in a style of its own
                lines, styles = _variant_lines(points_of), ("-", "--", "-.", ":")
            else:            # each arm across its widths, a line style per arm of the family
                lines = [[p for p in points_of if _arm(p) == arm] for arm in dict.fromkeys(map(_arm, points_of))]
                styles = ("-", "--", ":", "-.")
            labels = [_line_label(family, line) for line in lines]
            mean = [m for k, line in enumerate(lines) for m in _draw_errorbars(   # each label named once
                ax, line, f"C{i}", labels[k] if labels[k] not in labels[:k] else None, styles[k % len(styles)])]
            points_of = [p for line in lines for p in line]
            notes = [" ".join(x for x in (_arm_note(p), f"d={p['d_model']}" if widths else "") if x)
                     for p in points_of]
            for p, m, note in zip(points_of, mean, notes):
                if note:
                    ax.annotate(note, (p["state"], m), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                color=f"C{i}")
            _draw_seeds(ax, points_of, f"C{i}")
        draw_chance(ax, here, "chance (one value in n_values)")
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.08)  # room for the labels of points at 1
        ax.set_xlabel("state per layer (floats, log scale)", fontsize=8)
        name = f"N = {n_pairs:,} key-value pairs" if n_pairs is not None else "recall"
        name += f", ctx {ctx:,}" if contexts and ctx else ""
        name += f", {updates:,} updates" if updates else ""
        if widths:
            name += f", across model widths (d = {'/'.join(str(w) for w in sorted({p['d_model'] for p in here}))})"
        elif main is not None:
            name += f", width {main}"
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("accuracy at the queries")
    handles, labels = axes[0, -1].get_legend_handles_labels()
    for ax in axes[0, :-1]:  # the families a panel lacks are named by the others'
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles, labels = [*handles, h], [*labels, label]
    if any(any(first_stage_failed(p)) for p in points):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], marker="v", ls="none", mfc="none", color="0.3"))
        labels.append("a seed whose first stage ended short of its bound")
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)), fontsize=7)
    seeds = sorted({len(p["seeds"]) for p in points})
    rates = sorted({lr for p in points for lr in p.get("lrs", [])})
    best_of = f"; each point at its best learning rate of {', '.join(map(str, rates))}, picked on these documents" \
        if rates else ""
    below = "; below: by distance from pair to query, seed means, shaded: the seeds' range" if by_distance else ""
    fig.suptitle(fill_title(f"{title}: recall vs state (seed means, 95% t intervals over "
                            f"{'/'.join(map(str, seeds))} seeds, x: each seed{best_of}{below})",
                            4.6 * len(panels) - 0.4, 10), fontsize=10)
    return fig


def _floats(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def distance_tables(measured: list[tuple[Group, list]]) -> list[str]:
    """Markdown lines: recall by distance from pair to query, seed means per bin, one table per set of bins (one per
    context and N); a cell of a bin that held no query is '-'."""
    by_bins: dict[tuple, list[tuple[Group, list]]] = {}
    for g, _ in measured:
        seeds = [r.final.get("recall_by_distance") for r in g.runs]
        bins = shared_distance_bins(seeds)
        if bins is not None:
            by_bins.setdefault(tuple(map(tuple, bins)), []).append((g, seeds))
    lines = []
    for bins, rows in by_bins.items():
        lines += ["", "Recall by distance from pair to query (tokens; a bin a-b holds the distances from a up to, "
                  "not including, b), seed means; the queries a seed asks in each bin in the last row:", ""]
        lines += table_head("| runs | " + " | ".join(f"{a}-{b}" for a, b in bins) + " |")
        for g, seeds in rows:
            cells = ["-" if not any(s[i][3] for s in seeds) else _pct(float(np.mean([s[i][2] for s in seeds])))
                     for i in range(len(bins))]
            lines.append(f"| {g.label} | " + " | ".join(cells) + " |")
        lines.append("| queries a seed | " + " | ".join(str(b[3]) for b in rows[0][1][0]) + " |")
    return lines


def recall_section(groups: list[Group], n_boot: int, points: list[dict]) -> list[str]:
    """Markdown lines of the recall section ([] when no run measured recall); points: recall_points(groups), the
    figure's, whose best-rate picks the section lists."""
    measured = [(g, [accuracy_docs(r) for r in g.runs]) for g in groups]
    measured = [(g, docs) for g, docs in measured if all(d is not None for d in docs)]
    if not measured:
        return []
    lines = ["## Recall at the queries", "",
             f"Accuracy at the query positions only (the value after each query key), seed means with 95% bootstrap "
             f"intervals over the heldout documents ({n_boot} resamples: how exactly these weights were measured) "
             f"and Student's t intervals over the seeds (how much another seed could change it: the interval a "
             f"claim about the attention needs); for a staged run, the recall each seed's first stage ended with "
             f"and at which update (a seed that never left chance there failed to train, which says nothing about "
             f"state; \"short of its bound\": the stage ran all its updates without meeting its stop bound); "
             f"chance is one "
             f"value in n_values; state per layer in floats for one sequence, by the paper's definition (power: "
             f"D = C(d+p-1, p) times v).", ""]
    lines += table_head("| runs | seeds | accuracy (documents' interval) | seed-level 95% t | each seed | first stage, "
                        "each seed | chance | queries a seed | state per layer |")
    for g, docs in measured:
        iv = seed_aggregate(docs, "curve", n_boot)
        own = [float(d.loss.mean()) for d in docs]
        _, low, high = seed_interval(own)
        chance = g.first.final.get("recall_chance")
        first = [first_stage_end(r) for r in g.runs]
        short = [" short of its bound" if f is not None and f[2] is False else "" for f in first]
        lines.append(f"| {g.label} | {g.n_seeds} | {_pct(float(iv.estimate[0]))} [{_pct(float(iv.low[0]))}, "
                     f"{_pct(float(iv.high[0]))}] | {f'[{_pct(low)}, {_pct(high)}]' if len(own) > 1 else '-'} | "
                     f"{', '.join(map(_pct, own))} | "
                     f"{', '.join('-' if f is None else f'{_pct(f[0])} at {f[1]:,}{why}' for f, why in zip(first, short))} | "
                     f"{'-' if chance is None else _pct(chance)} | {g.first.final.get('recall_queries', '-')} | "
                     f"{_floats(run_state(g.first))} |")
    lines += distance_tables(measured)
    picked = [p for p in points if "lrs" in p]
    if picked:
        lines += ["", "The recall-vs-state figure draws each point at its best learning rate (the highest seed mean; "
                  "picked on the same documents, so optimistic):", ""]
        lines += [f"- {p['label']}: lr {p['lr']} of {', '.join(map(str, p['lrs']))}" for p in picked]
    rows = []
    for (ga, da), (gb, db) in combinations(measured, 2):
        if ga.first.heldout_key[1:] != gb.first.heldout_key[1:]:
            continue  # other data: other documents and queries
        iv = paired_seed_difference(da, db, "curve", ga.label, gb.label, n_boot)
        seeds = "-"
        if len(da) > 1 and len(db) > 1:
            w = welch_interval([d.loss.mean() for d in da], [d.loss.mean() for d in db])
            seeds = f"{100 * w.estimate:+.1f} [{100 * w.low:+.1f}, {100 * w.high:+.1f}]"
        rows.append(f"| {ga.label} | {gb.label} | {100 * float(iv.estimate[0]):+.1f} [{100 * float(iv.low[0]):+.1f}, "
                    f"{100 * float(iv.high[0]):+.1f}] | {seeds} |")
    if rows:
        lines += ["", "Paired differences of accuracy (first minus second, points), on the same documents and queries; "
                  "seed-level: Welch's t over the seeds' accuracies.", ""]
        lines += table_head("| run | minus run | paired over documents | seed-level |") + rows
    return lines + [""]
