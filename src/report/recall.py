"""The report's recall section (runs on recall data, `data=mqar`): accuracy at the queries per group of seeds with
its interval, and paired differences between groups evaluated on the same heldout documents.

Each run's final per-document record holds `hits` (n_docs, n_queries); a document's accuracy is its mean. The
intervals reuse the loss statistics' bootstrap (`longctx.report.stats`) on a one-bin record whose "loss" is each
document's accuracy: seed means over joint resamples of the documents, paired differences on the same resamples.
Seed-level intervals (Welch's t over the seeds' own accuracies, `longctx.report.verdict`) stand beside them.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

from longctx.report.markdown import table_head
from longctx.report.runs import Group, Run
from longctx.report.stats import DocBins, paired_seed_difference, seed_aggregate
from longctx.report.verdict import welch_interval


def accuracy_docs(run: Run) -> DocBins | None:
    """The run's final evaluation as a one-bin record of per-document accuracy (None: no recall record)."""
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
    return DocBins(loss=hits.mean(axis=1, dtype=np.float64)[:, None], edges=np.asarray([[0, run.ctx]]),
                   doc_index=np.asarray(doc_index, np.int64))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def recall_section(groups: list[Group], n_boot: int) -> list[str]:
    """Markdown lines of the recall section ([] when no run measured recall)."""
    measured = [(g, [accuracy_docs(r) for r in g.runs]) for g in groups]
    measured = [(g, docs) for g, docs in measured if all(d is not None for d in docs)]
    if not measured:
        return []
    lines = ["## Recall at the queries", "",
             f"Accuracy at the query positions only (the value after each query key), seed means with 95% bootstrap "
             f"intervals over the heldout documents ({n_boot} resamples); chance is one value in n_values.", ""]
    lines += table_head("| runs | seeds | accuracy | seeds' range | chance | queries a seed |")
    for g, docs in measured:
        iv = seed_aggregate(docs, "curve", n_boot)
        own = [float(d.loss.mean()) for d in docs]
        chance = g.first.final.get("recall_chance")
        lines.append(f"| {g.label} | {g.n_seeds} | {_pct(float(iv.estimate[0]))} [{_pct(float(iv.low[0]))}, "
                     f"{_pct(float(iv.high[0]))}] | {_pct(min(own))}-{_pct(max(own))} | "
                     f"{'-' if chance is None else _pct(chance)} | {g.first.final.get('recall_queries', '-')} |")
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
