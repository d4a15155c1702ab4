"""Compare runs: ICL curves overlaid, best-context loss against FLOPs and context, tables with bootstrap intervals
and paired differences, as Markdown + PNGs.

    python -m longctx.report RUN_DIR_OR_SWEEP_DIR... --out DIR [--at-flops 1e15] [--title TEXT] [--bootstrap 2000]

A run directory is one holding metrics.jsonl (what the trainer writes, with config.yaml beside it); any other
folder is searched for run directories below it (a multirun sweep). A run with no evaluation yet is listed as left
out; one still training is marked unfinished; a cut last line of metrics.jsonl is skipped with a warning.

Runs are labelled by their attention and every config key that differs between them; runs that differ only in
their seed (the same data, longctx.report.evaldata, and the same init_from) form one row (seed mean, interval, spread
across seeds) and one curve with a band; two runs of a row with one seed or identical records (a copy) are refused.
Intervals come from the per-document records an evaluation writes (eval/step_XXXXXXXX.npz; see
longctx.report.stats): 95% percentile bootstrap over heldout documents; differences between runs evaluated on the
same documents are paired (runs on other data never are: report.md says why). Nothing is written in any run's
folder, over a file read or over another output, and every output is checked writable before the first is written.
DIR gets:

    report.md                  the table (each run's final evaluation, numbers as in its metrics.jsonl), the
                               intervals, the paired differences, the runs' retrieval results (passkey, needle;
                               longctx.report.retrieval), provenance that differs, and the figures
    icl_curves.png             final ICL curves overlaid (bands: 95% intervals), each data's Bayes optimum dashed
                               (with --at-flops: each run's last evaluation within that FLOP budget instead,
                               said under the figure; the tables stay final; not with --record)
    gap_to_optimum.png         the same curves minus the Bayes optimum, bin by bin, against the 0.05-nat line
                               (runs whose data has a known optimum; omitted when none has)
    paired_differences.png     per bin, each run's loss minus the first run's on the same heldout documents, with
                               the paired 95% interval (runs with per-document records)
    intervals.json             the intervals and paired differences, machine-readable (per-bin ones too)
    best_context_vs_flops.png  best-context loss through training against training FLOPs
    best_context_vs_context.png  final best-context loss against the training context (two contexts or more)
    icl_over_training.png      every run's ICL curve at each evaluation (ICL vs updates), one panel per run
    recall_vs_state.png        on recall data: accuracy at the queries against state (longctx.report.recall)

`--record FILE.json` also writes the figures' compact record (longctx.report.record) for scripts/plot_results.py;
`--carry OLD.json` carries an earlier record's runs and recall points into it as they were written, so a sweep run
on several machines over time keeps one record (the new runs' labels must not repeat a carried point's: --label).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

from longctx.plotting import save_figure
from longctx.report import figures
from longctx.report.runs import (Group, Run, check_seed_labels, data_difference, describe_comparison, group_runs,
                                 label_runs, load_runs, log, provenance_differences, refuse_duplicate_seeds,
                                 training_flops)
from longctx.report.manifest import MANIFEST, sha256, update_manifest, wrote
from longctx.report.markdown import table_head
from longctx.report.record import FIGURES, carried_entries, check_carried, read_carried, write_record
from longctx.report.recall import (best_rates, draw_recall_vs_state, merge_seeds, point_key, recall_points,
                                   recall_section)
from longctx.report.retrieval import retrieval_entries, retrieval_section
from longctx.report.stats import (DEFAULT_BOOTSTRAP, Interval, paired_seed_difference, seed_aggregate,
                                  seed_pairs_agreeing)

MAX_PAIRS = 15  # more groups than this: each compared with the first of its data only
MAX_BOOTSTRAP = 100_000  # resamples: ~0.8 GB of weights per 1,000 documents


# ----- tables -----------------------------------------------------------------------------------------------

def _fmt_ratio(wsfr) -> str:
    if wsfr is None:
        return "-"
    if wsfr == float("inf"):
        return "inf:1"
    return f"{wsfr:.3g}:1" if wsfr >= 1 else f"1:{1 / wsfr:.3g}"


def table_rows(runs: list[Run]) -> list[dict]:
    """One row per run from its final evaluation, the numbers exactly as metrics.jsonl holds them."""
    rows = []
    for run in runs:
        rec = run.final
        rows.append({
            "run": run.name or run.path.name, "attention": run.tag, "ctx": run.ctx, "step": rec["step"],
            "tokens": rec.get("tokens_all_stages", rec.get("tokens")), "flops": training_flops(rec),
            "best_context_loss": rec["best_context_loss"],
            "best_context_position": rec.get("best_context_position", (rec.get("best_context_bin") or [None, None])[1]),
            "last10_loss": rec.get("last10_loss"), "best_context_gap": rec.get("best_context_gap"),
            "max_bin_gap": rec.get("max_bin_gap"), "state_size": rec.get("state_size"), "wsfr": rec.get("wsfr"),
            "tokens_per_s": rec.get("tokens_per_s"), "status": run.status,
        })
    return rows


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(rows: list[dict]) -> str:
    head = ("| run | attention | ctx | steps | training FLOPs (every stage) | best-context loss | "
            "best-context position | last-10% loss | gap to optimum | largest gap over the curve | state size | WSFR | tokens/s | status |")
    lines = table_head(head)
    for r in rows:
        lines.append(f"| {r['run']} | {r['attention']} | {r['ctx']} | {r['step']} | {_num(r['flops'], '.3g')} | "
                     f"{r['best_context_loss']:.3f} | {_num(r['best_context_position'], 'd')} | "
                     f"{_num(r['last10_loss'], '.3f')} | "
                     f"{_num(r['best_context_gap'], '+.3f')} | {_num(r['max_bin_gap'], '+.3f')} | "
                     f"{_num(r['state_size'], ',')} | {_fmt_ratio(r['wsfr'])} | {_num(r['tokens_per_s'], ',.0f')} | "
                     f"{r['status']} |")
    return "\n".join(lines)


def _final_docs(group: Group):
    docs = [run.doc_bins(run.final) for run in group.runs]
    return docs if all(d is not None for d in docs) else None


def fmt_interval(iv: Interval | None, fmt: str = ".3f") -> str:
    if iv is None:
        return "-"
    return f"{format(iv.estimate, fmt)} [{format(iv.low, fmt)}, {format(iv.high, fmt)}]"


INTERVAL_STATS = [("best_context_loss", "best-context loss", False), ("best_context_gap", "best-context gap", True),
                  ("last_bin_gap", "last-bin gap", True), ("last10_gap", "last-10% gap (from bins)", True)]


def interval_rows(groups: list[Group], n_boot: int) -> list[dict]:
    """Per group of seeds: each statistic's seed mean with its 95% bootstrap interval (final evaluations with
    per-document records), and the seeds' spread of the best-context loss."""
    rows = []
    for group in groups:
        docs = _final_docs(group)
        row = {"group": group.label, "n_seeds": group.n_seeds,
               "steps": sorted({r.final["step"] for r in group.runs}), "docs": None if docs is None else docs[0].n_docs}
        for stat, _, needs_optimum in INTERVAL_STATS:
            ok = docs is not None and (not needs_optimum or all(d.bayes is not None for d in docs))
            row[stat] = seed_aggregate(docs, stat, n_boot) if ok else None
        finals = [r.final["best_context_loss"] for r in group.runs]
        row["best_context_loss_seeds"] = finals
        row["unfinished"] = unfinished(group)
        rows.append(row)
    return rows


def unfinished(group: Group) -> list[str]:
    """The names of a group's runs that are still short of their bound (Run.status): their seeds are averaged in."""
    return [run.name for run in group.runs if run.status != "complete"]


def marked(label: str, names: list[str]) -> str:
    """A table's group label, saying which of its seeds are unfinished."""
    return label if not names else f"{label} (unfinished: {', '.join(names)})"


def interval_table(rows: list[dict]) -> str:
    head = ("| runs | seeds | steps | documents | " + " | ".join(name for _, name, _ in INTERVAL_STATS)
            + " | best-context loss across seeds (sd; min-max) |")
    lines = table_head(head)
    for r in rows:
        seeds = r["best_context_loss_seeds"]
        spread = ("-" if len(seeds) < 2 else
                  f"{np.std(seeds, ddof=1):.3f}; {min(seeds):.3f}-{max(seeds):.3f}")
        steps = "/".join(str(s) for s in r["steps"])
        lines.append(f"| {marked(r['group'], r['unfinished'])} | {r['n_seeds']} | {steps} | {_num(r['docs'], 'd')} | "
                     + " | ".join(fmt_interval(r[s], "+.3f" if needs else ".3f") for s, _, needs in INTERVAL_STATS)
                     + f" | {spread} |")
    return "\n".join(lines)


PAIRED_STATS = [("best_context_loss", "best-context loss"), ("last_bin_loss", "last-bin loss"),
                ("last10_loss", "last-10% loss (from bins)")]


def _documents_key(group: Group) -> tuple:
    """Groups with equal keys were evaluated on the same heldout documents (their contexts may differ: the
    one-number statistics below pair across contexts)."""
    return group.first.heldout_key[1:]


def different_data_lines(groups: list[Group]) -> list[str]:
    """One line for each two sets of heldout documents among the groups (not each two groups: a sweep over the data
    pairs within each set), naming what tells them apart."""
    by_docs: dict[tuple, list[Group]] = {}
    for g in groups:
        by_docs.setdefault(_documents_key(g), []).append(g)

    def named(gs: list[Group]) -> str:
        shown = "; ".join(g.label for g in gs[:2]) + (f" and {len(gs) - 2} more" if len(gs) > 2 else "")
        return shown if len(gs) == 1 else f"{len(gs)} groups ({shown})"
    return [f"{named(a)} and {named(b)}: evaluated on different data ({data_difference(a[0].first, b[0].first)}); a "
            f"paired difference needs the same documents" for a, b in combinations(by_docs.values(), 2)]


def paired_rows(groups: list[Group], n_boot: int) -> tuple[list[dict], list[str]]:
    """Paired differences (first minus second) between groups evaluated on the same heldout documents, and one
    line for each pair refused (same data, other documents)."""
    each = [(g, [run.doc_bins(run.final) for run in g.runs]) for g in groups]   # _final_docs, the runs named
    with_docs = [(g, d) for g, d in each if all(x is not None for x in d)]
    pairs = list(combinations(with_docs, 2))
    refused = [f"{g.label}: " + ", ".join(r.name for r, x in zip(g.runs, d) if x is None) + " has no usable "
               "per-document record of its final evaluation (eval/step_*.npz: missing, or rows of packed documents); "
               "the group is in no paired difference" for g, d in each
               if any(x is None for x in d)] if len(groups) > 1 else []
    refused += different_data_lines([g for g, _ in with_docs])
    pairs = [(a, b) for a, b in pairs if _documents_key(a[0]) == _documents_key(b[0])]
    if len(pairs) > MAX_PAIRS:
        firsts = {}
        for g, d in with_docs:
            firsts.setdefault(_documents_key(g), (g, d))
        pairs = [(a, b) for a, b in pairs if a is firsts[_documents_key(a[0])]]
    rows = []
    for (ga, da), (gb, db) in pairs:
        try:
            row = {"a": ga.label, "b": gb.label, "unfinished_a": unfinished(ga), "unfinished_b": unfinished(gb)}
            for stat, _ in PAIRED_STATS:
                row[stat] = paired_seed_difference(da, db, stat, ga.label, gb.label, n_boot, same_bins=False)
            if len(da) > 1 or len(db) > 1:
                row["best_context_loss_seeds"] = paired_seed_difference(
                    da, db, "best_context_loss", ga.label, gb.label, n_boot, resample_seeds=True, same_bins=False)
            row["seed_pairs"] = seed_pairs_agreeing(da, db, "best_context_loss")
            rows.append(row)
        except ValueError as err:
            refused.append(str(err))
    for line in refused:
        log.warning(f"warning: not paired: {line}")
    return rows, refused


def paired_table(rows: list[dict]) -> str:
    head = ("| run | minus run | " + " | ".join(name for _, name in PAIRED_STATS)
            + " | best-context loss, seeds resampled too | seed pairs agreeing |")
    lines = table_head(head)
    for r in rows:
        k, n = r["seed_pairs"]
        lines.append(f"| {marked(r['a'], r['unfinished_a'])} | {marked(r['b'], r['unfinished_b'])} | "
                     + " | ".join(fmt_interval(r[s], "+.4f") for s, _ in PAIRED_STATS)
                     + f" | {fmt_interval(r.get('best_context_loss_seeds'), '+.4f')} | {k}/{n} |")
    return "\n".join(lines)


def _iv_json(iv: Interval | None):
    if iv is None:
        return None
    out = {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "n_boot": iv.n_boot, "n_seeds": iv.n_seeds}
    if iv.seed_std is not None:
        out.update(seed_std=iv.seed_std, seed_min=iv.seed_min, seed_max=iv.seed_max)
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out.items()}


def intervals_json(groups: list[Group], irows: list[dict], prows: list[dict], n_boot: int) -> dict:
    """The report's intervals, machine-readable: per group the scalar statistics and the per-bin gap curve, and
    the paired differences."""
    out = {"level": 0.95, "n_boot": n_boot, "groups": [], "paired": []}
    for group, row in zip(groups, irows):
        docs = _final_docs(group)
        entry = {"label": group.label, "runs": [r.name for r in group.runs], "steps": row["steps"],
                 "unfinished": row["unfinished"],
                 **{stat: _iv_json(row[stat]) for stat, _, _ in INTERVAL_STATS}}
        if docs is not None:
            entry["bins"] = docs[0].edges.tolist()
            entry["curve"] = _iv_json(seed_aggregate(docs, "curve", n_boot))
            if all(d.bayes is not None for d in docs):
                entry["gap_curve"] = _iv_json(seed_aggregate(docs, "gap_curve", n_boot))
        out["groups"].append(entry)
    for row in prows:
        out["paired"].append({"run": row["a"], "minus": row["b"],
                              "unfinished": row["unfinished_a"] + row["unfinished_b"],
                              **{stat: _iv_json(row[stat]) for stat, _ in PAIRED_STATS},
                              "best_context_loss_seeds_resampled": _iv_json(row.get("best_context_loss_seeds")),
                              "seed_pairs_agreeing": list(row["seed_pairs"])})
    return out


# ----- the report -------------------------------------------------------------------------------------------

def write_report(paths: list[Path], out: Path, title: str | None = None, at_flops: float | None = None,
                 n_boot: int = DEFAULT_BOOTSTRAP, record: Path | None = None, labels: list[str] | None = None,
                 record_figures: list[str] | None = None, carry: list[Path] = (), add_seeds: bool = False) -> Path:
    out = Path(out)
    if carry and record is None:
        raise ValueError("--carry: needs --record, the record the carried runs go into")
    if at_flops is not None and record is not None:   # the record keeps final evaluations: its figures would differ
        raise ValueError("--at-flops with --record: a record keeps each run's final evaluation, from which "
                         "plot_results.py would redraw other curves under the same names; make the record without "
                         "--at-flops")
    if add_seeds and not carry:
        raise ValueError("--add-seeds: needs --carry, the record whose points the new seeds join")
    runs, left_out = load_runs(paths)
    carried = [read_carried(path) for path in carry]
    outputs = output_files(out, record)
    refuse_overwrites(runs, outputs, [f for c in carried for f in (c["path"], c["path"].with_suffix(".npz"))])
    if record is not None:
        refuse_foreign_record(Path(record), out)
    earlier = earlier_report(out)  # before any work: an --out holding files the report did not write is refused
    check_carried(carried, runs)
    keys = label_runs(runs, frozenset(entry["name"] for c in carried for entry in c["record"]["runs"]))
    relabel(runs, labels or [])
    groups = group_runs(runs)
    refuse_duplicate_seeds(groups)
    check_seed_labels(carried, runs)  # a --label joining two configs (or one seed twice) under one label is refused
    title = title or describe_comparison(runs, keys)
    figs = [("ICL curves", "icl_curves.png", figures.draw_icl_overlay(groups, runs, title, at_flops, n_boot))]
    if any("bayes_curve" in run.final for run in runs):
        figs.append(("Gap to the Bayes optimum", "gap_to_optimum.png",
                     figures.draw_gap_to_optimum(groups, title, at_flops, n_boot)))
    notes = []
    paired_fig = figures.draw_paired_differences(groups, title, n_boot)
    if paired_fig is not None:
        figs.append(("Paired differences per bin", "paired_differences.png", paired_fig))
    by_flops = figures.draw_best_vs_flops(groups, title)
    if by_flops is None:
        notes.append("No best-context loss vs FLOPs figure: no record holds its training FLOPs.")
    else:
        figs.append(("Best-context loss vs training FLOPs", "best_context_vs_flops.png", by_flops))
    by_context = figures.draw_best_vs_context(groups, title)
    if by_context is None:
        notes.append("No best-context loss vs context figure: the runs span one context "
                     f"({groups[0].first.ctx}); it needs two or more.")
    else:
        figs.append(("Best-context loss vs context", "best_context_vs_context.png", by_context))
    points = recall_points(groups)
    seeds = {**{e["name"]: e.get("seed") for c in carried for e in c["record"]["runs"]},
             **{r.name: r.seed for r in runs}} if add_seeds else None
    recall = carry_points(carried, points, seeds)  # the figure's and the record's
    if recall:
        figs.append(("Recall vs state", "recall_vs_state.png", draw_recall_vs_state(recall, title)))
    figs.append(("ICL curves through training", "icl_over_training.png",
                 figures.draw_icl_over_training(runs, title)))
    record_names = None
    if record is not None:
        kinds = [name.removesuffix(".png") for _, name, _ in figs if name != "icl_over_training.png"]
        missing = [kind for kind in record_figures or [] if kind not in kinds]
        if missing:
            raise ValueError(f"--record-figures: {', '.join(missing)} not drawn for these runs "
                             f"(drawn: {', '.join(kinds)})")
        record_names = {kind: f"{Path(record).stem}_{kind}.png" for kind in kinds
                        if record_figures is None or kind in record_figures}

    text = [f"# {title}", "", f"{len(runs)} run{'s' * (len(runs) != 1)}: " + ", ".join(f"`{r.name}` ({r.label})"
                                                                                for r in runs), ""]
    for c in carried:
        text += [f"Carried into the record from `{c['path']}` as it was written: {len(c['record']['runs'])} runs, "
                 f"{len(c['record'].get('recall', []))} recall points (in the recall figure; the tables below are "
                 f"this report's runs').", ""]
    if left_out:
        text += ["Left out (no evaluation to report yet, or unreadable):", ""]
        text += [f"- {line}" for line in left_out] + [""]
    text += ["Final evaluation of each run (heldout; losses in nats/token; best context = the lowest bin of the "
             "binned ICL curve among bins of at least 16 positions, its position the bin's end).", "",
             markdown_table(table_rows(runs)), ""]
    irows = interval_rows(groups, n_boot)
    text += ["## Intervals", "",
             f"Seed means with 95% percentile bootstrap intervals ({n_boot} resamples of the heldout documents, "
             "drawn jointly for the seeds of a row; gaps are to the Bayes optimum). They need the per-document "
             "records (`eval/step_*.npz`); '-' where a run has none.", "", interval_table(irows), ""]
    prows, refused = paired_rows(groups, n_boot)
    if prows or refused:
        text += ["## Paired differences", "",
                 "First run minus second, on the same heldout documents (each resample draws the same documents for "
                 "both: the noise they share cancels; runs of other contexts pair on these one-number statistics). "
                 "These intervals hold the heldout noise of the seeds trained; 'seeds resampled too' also redraws "
                 "each side's seeds (training noise; coarse with few seeds), and 'seed pairs agreeing' counts the "
                 "seed pairs whose best-context losses differ in the means' direction. A difference is separated "
                 "when its intervals exclude 0 and every seed pair agrees.", ""]
        text += [paired_table(prows), ""] if prows else []
        text += [f"- not paired: {line}" for line in refused] + ([""] if refused else [])
    intervals = json.dumps(intervals_json(groups, irows, prows, n_boot), indent=1) + "\n"
    retrieval = retrieval_entries(runs)
    text += retrieval_section(retrieval)
    retrieval = carried_entries(carried, "retrieval") + retrieval
    text += recall_section(groups, n_boot, points)
    provenance = provenance_differences(runs)
    if provenance:
        text += ["## Provenance that differs", ""]
        text += [f"- `{key}`: " + "; ".join(f"{name}: {value}" for name, value in values.items())
                 for key, values in provenance.items()] + [""]
        for key, values in provenance.items():
            print(f"provenance {key} differs: " + "; ".join(f"{n}: {v}" for n, v in values.items()))
    for name, png, _ in figs:
        text += [f"## {name}", "", f"![{name}]({png})", ""]
        if at_flops is not None and png in ("icl_curves.png", "gap_to_optimum.png"):
            text[-1:-1] = [f"Each run at its last evaluation within {at_flops:.3g} training FLOPs (--at-flops); the "
                           f"tables above are every run's final evaluation.", ""]
    text += notes
    check_writable(outputs)  # every output, before the first is written
    out.mkdir(parents=True, exist_ok=True)
    for _, name, fig in figs:
        save_figure(fig, out / name)
    (out / "intervals.json").write_text(intervals)
    report = out / "report.md"
    report.write_text("\n".join(text) + "\n")
    written = [name for _, name, _ in figs] + ["intervals.json", "report.md"]
    gone = sorted(set(earlier) - set(written))
    for name in gone:  # an earlier report's figure this one does not draw: not left beside it
        (out / name).unlink(missing_ok=True)
    write_manifest(out, written)
    if earlier:   # said, not silent: the user may have meant another --out
        print(f"note: --out {out} held an earlier report: replaced" + (f" ({', '.join(gone)} removed: not drawn "
              f"this time)" if gone else ""), file=sys.stderr)
    if record is not None:
        Path(record).parent.mkdir(parents=True, exist_ok=True)    # as --out's: inside it, or a folder of its own
        write_record(runs, title, Path(record), record_names, retrieval, recall, carried, listed_in=out)
    return report


def carry_points(carried: list[dict], points: list[dict], seeds: dict | None = None) -> list[dict]:
    """The carried records' recall points, then these runs' (`points`). A point whose label (but its seed count)
    stands in both is refused (a figure with two points of one label could not say which is which), unless `seeds`
    (run name -> seed: --add-seeds) is given: then its seeds join the carried point's (recall.merge_seeds)."""
    out = carried_entries(carried, "recall")
    at = {point_key(p): i for i, p in enumerate(out)}
    new = []
    for point in points:
        i = at.get(point_key(point))
        if i is None:
            new.append(point)
        elif seeds is None:
            raise ValueError(f"--carry: recall point {point['label']!r} is both carried and among the runs reported; "
                             f"give the new runs other labels (--label), or --add-seeds to add them to its seeds")
        else:
            out[i] = merge_seeds(out[i], point, seeds)
    return best_rates(out + new)


def relabel(runs: list[Run], items: list[str]) -> None:
    """--label OLD=NEW items, applied in the order given: the runs whose label (without the seed, as the report writes
    it) holds every ', '-separated part of OLD show NEW where the first of them stood (so 'exp=softmax' names softmax
    at every N of a sweep over data, and a whole label renames one group). Labels hold 'key=value' parts themselves,
    so OLD is the part before the '=' that leaves parts of a known label; ValueError naming an item that matches
    none."""
    known = [run.seed_label.split(", ") for run in runs]

    def matches(old: str) -> bool:
        return any(set(old.split(", ")) <= set(parts) for parts in known)

    rules = []
    for item in items:
        splits = [(item[:i], item[i + 1:]) for i, c in enumerate(item) if c == "=" and matches(item[:i])]
        if not splits or not splits[-1][1]:
            raise ValueError(f"--label {item!r}: give OLD=NEW, OLD one of the runs' labels or some of its parts "
                             f"({'; '.join(sorted({run.seed_label for run in runs}))})")
        old, new = splits[-1]
        rules.append((old.split(", "), new))
    for run in runs:
        parts = run.seed_label.split(", ")
        for gone, new in rules:
            if set(gone) <= set(parts):
                at = min(parts.index(g) for g in gone)
                parts = parts[:at] + [new] + [p for p in parts[at:] if p not in gone]
        run.seed_label = ", ".join(parts)
        run.label = ", ".join([run.seed_label] + [p for p in run.label.split(", ") if p.startswith("seed=")])


REPORT_FILES = ("report.md", "intervals.json", "icl_over_training.png") + tuple(f"{kind}.png" for kind in FIGURES)


def output_files(out: Path, record: Path | None) -> list[tuple[Path, str]]:
    """[(a file the report may write, the flag that chose it)]."""
    files = [(Path(out) / name, "--out") for name in REPORT_FILES]
    if record is not None:
        files += [(Path(record), "--record"), (Path(record).with_suffix(".npz"), "--record")]
    return files


def run_folder_of(folder: Path) -> Path | None:
    """The run folder holding `folder` (itself or a folder above it), in the report or not: one with config.yaml
    and metrics.jsonl, a run lock or checkpoints/ (a run just started has no metrics yet)."""
    for candidate in [folder, *folder.parents]:
        if (candidate / "config.yaml").is_file() and any(
                (candidate / name).exists() for name in ("metrics.jsonl", ".lock", "checkpoints")):
            return candidate
    return None


def refuse_overwrites(runs: list[Run], outputs: list[tuple[Path, str]], read: list[Path] = ()) -> None:
    """ValueError, before anything is written, when an output would land in a run's folder (its figures, eval/
    records and checkpoints share the report's names), on a file the report reads (`read`: files beside the runs',
    such as a carried record), or on another output."""
    inputs = {p.resolve() for run in runs for p in [*run.path.rglob("*"), run.path.parent / "stages.json"]
              if p.is_file()} | {Path(p).resolve() for p in read}
    seen: dict[Path, Path] = {}
    for path, flag in outputs:
        resolved = path.resolve()
        owner = run_folder_of(resolved.parent)
        if owner is not None:
            raise ValueError(f"{flag} {path.parent if flag == '--out' else path}: is a folder of the run {owner}, "
                             f"whose files the report would overwrite; give a folder outside every run")
        if resolved in inputs:
            raise ValueError(f"{flag} {path}: is a file the report reads; give another path")
        if resolved in seen:
            raise ValueError(f"{flag} {path}: is also {seen[resolved]}, another of the report's outputs; "
                             f"give another path")
        seen[resolved] = path


def refuse_foreign_record(record: Path, out: Path) -> None:
    """An existing --record pair is replaced only when a report wrote it: its JSON is a report's record, or each of
    its files is one a report with this --out wrote, unchanged (--out's list names it: a write cut short between the
    two files). Anything else is refused, naming the file."""
    present = [path for path in (record, record.with_suffix(".npz")) if path.exists()]
    if not present or is_report_record(record):
        return
    foreign = [path for path in present if not wrote(out, path)]
    if foreign:
        raise ValueError(f"--record {record}: {foreign[0]} exists and is not a report's record (longctx.report "
                         f"--record writes a JSON with kind 'report' and its .npz, listed in --out's {MANIFEST}; "
                         f"an edited one is not its own); nothing is overwritten")


def is_report_record(path: Path) -> bool:
    """Whether `path` holds a compact record an earlier report wrote (which a new --record may replace)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("kind") == "report" and isinstance(record.get("runs"), list)


def check_writable(outputs: list[tuple[Path, str]]) -> None:
    """ValueError naming the first output that cannot be written (its folder or the file itself read-only, or a file
    where its folder would be made)."""
    for path, flag in outputs:
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise ValueError(f"{flag} {path}: {folder} is a file, where the output's folder would be; nothing written")
        if path.is_dir():
            raise ValueError(f"{flag} {path}: is a folder, where the report writes a file; nothing written")
        if path.exists() and not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {path}: is read-only; nothing written")
        if not path.exists() and not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path}: {folder} is not writable; nothing written")


def earlier_report(out: Path) -> list[str]:
    """The files of the report's names in --out (an earlier report's, which a new report replaces). ValueError when one
    of them is not, byte for byte, what an earlier report wrote there (edited by hand, or another tool's file of that
    name): nothing is overwritten."""
    out = Path(out)
    present = [name for name in REPORT_FILES if (out / name).is_file()]
    for name in present:
        if not wrote(out, out / name):
            raise ValueError(f"--out {out}: {name} is not the file an earlier report wrote there (edited since, or "
                             f"not a report's); give another --out, or move it away. Nothing was written")
    return present


def write_manifest(out: Path, names: list[str]) -> None:
    """List the report files just written in --out (the files of its names it did not write are gone)."""
    update_manifest(out, {out / name: sha256((out / name).read_bytes()) for name in names},
                    dropped=[out / name for name in REPORT_FILES if name not in names])


def check_out(out: Path) -> str | None:
    """Why --out cannot receive the report (None when it can): checked before any work."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: is a file; give a folder for report.md and the figures"
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: {parent} is not writable"
    return None


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m longctx.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or sweep directories above them")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.md and the PNGs")
    parser.add_argument("--title", default=None,
                        help="figure and report title (default: what the runs compare, from their configs)")
    parser.add_argument("--at-flops", type=float, default=None,
                        help="overlay each run's ICL curve at its last evaluation within this many training FLOPs")
    parser.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, metavar="N",
                        help=f"bootstrap resamples of the heldout documents per interval (default {DEFAULT_BOOTSTRAP})")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE.json",
                        help="also write the figures' compact record (JSON + per-document npz beside it) for "
                             "scripts/plot_results.py to redraw them without the run folders")
    parser.add_argument("--label", action="append", default=[], metavar="OLD=NEW",
                        help="show the runs labelled OLD (the label without its seed, as the report writes it, or "
                             "some of its parts) as NEW; repeatable, applied in order")
    parser.add_argument("--carry", action="append", default=[], type=Path, metavar="RECORD.json",
                        help="with --record: carry an earlier record's runs, per-document arrays and recall points "
                             "into the new record as they were written (a sweep grown over several machines keeps "
                             "one record); repeatable; a run may stand in one source only")
    parser.add_argument("--add-seeds", action="store_true",
                        help="with --carry: new runs of a carried recall point (its label, as the report writes it) "
                             "join its seeds instead of being refused; their seeds must be new ones")
    parser.add_argument("--record-figures", default=None, metavar="KIND,...",
                        help="the figures the record lists (default: all drawn but icl_over_training; kinds: "
                             "icl_curves, gap_to_optimum, paired_differences, best_context_vs_flops, "
                             "best_context_vs_context)")
    args = parser.parse_args(argv)
    if args.record is not None and (args.record.suffix != ".json" or args.record.is_dir()):
        parser.exit(2, f"error: --record {args.record}: give a .json file (its folder is made, as --out's)\n")
    if not 1 <= args.bootstrap <= MAX_BOOTSTRAP:
        parser.exit(2, f"error: --bootstrap {args.bootstrap}: must be between 1 and {MAX_BOOTSTRAP}\n")
    if args.at_flops is not None and not (math.isfinite(args.at_flops) and args.at_flops > 0):
        parser.exit(2, f"error: --at-flops {args.at_flops}: must be a finite number of FLOPs > 0\n")
    problem = check_out(args.out)
    if problem:
        parser.exit(2, f"error: {problem}\n")
    kinds = None if args.record_figures is None else [k for k in args.record_figures.split(",") if k]
    unknown = [k for k in kinds or [] if k not in FIGURES]
    if unknown:
        parser.exit(2, f"error: --record-figures {unknown[0]}: not a figure kind (kinds: {', '.join(FIGURES)})\n")
    try:
        report = write_report(args.paths, args.out, args.title, args.at_flops, args.bootstrap, args.record,
                              args.label, kinds, args.carry, args.add_seeds)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(report)
    return report


if __name__ == "__main__":
    main()
