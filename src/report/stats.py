"""Bootstrap intervals of the ICL metrics from per-document binned losses (pure numpy).

Input: the per-document record of one heldout evaluation (see `load_doc_bins`): `loss` (n_docs, n_bins), each
document's mean next-token NLL in each bin of the ICL curve; `bayes` (n_docs, n_bins) the optimum's, when known;
`edges` (n_bins, 2) the bins' [start, end); `doc_index` (n_docs,) which heldout documents they are.

Every metric of the report is a function of the document-mean binned curves, so one bootstrap serves all: a
resample of the documents (drawn with replacement, `n_boot` times, from a fixed RNG seed) is a row of weights
(counts / n_docs), and a resampled mean curve is that row times the per-document array. Intervals are percentile
intervals of the resampled statistic. Two runs evaluated on the same documents are compared *paired*: both use
the same resamples, so the document-to-document variation they share cancels from their difference (heldout noise
on one bin is ~0.04 nats over 256 documents, larger than most differences between runs).

Seeds (runs that differ only in their training seed, evaluated on the same documents): `seed_aggregate` resamples
the documents jointly (the same rows for every seed) and averages the seeds' statistics on each resample. The
interval is therefore the document-sampling uncertainty of the seed mean *for the seeds trained*; the spread of
the seeds' own values (their standard deviation and range) is reported beside it. Seeds evaluated on different
documents are resampled independently.

Training noise: `paired_seed_difference(..., resample_seeds=True)` also redraws each side's seeds with replacement
on every resample (a two-level bootstrap: seeds, then documents), so its interval holds both the heldout noise and
the seed-to-seed spread; with three seeds a side it is coarse, and `seed_pairs_agreeing` says how many of the
n_a x n_b seed pairs differ in the estimate's direction. Statistics that are one number per evaluation
(best-context loss, last-bin loss, last-10% loss) pair runs of different contexts on the same documents
(`same_bins=False`): each run's statistic comes from its own bins, the documents are drawn together.
"""
from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from longctx.eval.metrics import min_positions_for

DEFAULT_BOOTSTRAP = 2000
DEFAULT_SEED = 0
LEVEL = 0.95
# resamples x documents: the weights and the draws take 8 bytes each per entry (3 arrays: ~2.4 GiB)
MAX_RESAMPLED_DOCS = 100_000_000


@dataclass(frozen=True)
class DocBins:
    """One evaluation's per-document binned losses (the <run_dir>/eval/step_XXXXXXXX.npz record)."""
    loss: np.ndarray             # (n_docs, n_bins) float
    edges: np.ndarray            # (n_bins, 2) int: each bin's [start, end) positions
    doc_index: np.ndarray        # (n_docs,) int: the heldout documents' indices
    bayes: np.ndarray | None = None  # (n_docs, n_bins) float, the optimum's, when the data has an exact one
    packed: bool = False         # rows of packed documents: NaN where a row reaches no position of a bin; the
    #                              statistics below assume finite losses (the report gives such runs no interval)

    @property
    def n_docs(self) -> int:
        return self.loss.shape[0]


def load_doc_bins(path: str | Path, prefix: str = "") -> DocBins:
    """Read a per-document record (no pickles); a missing array or a shape that disagrees names the file. prefix:
    the record's arrays are `<prefix>loss`, ... (a compact report record keeps every run's in one file)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[prefix + k] for k in ("loss", "edges", "doc_index", "bayes", "packed")
                      if prefix + k in f.files}
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError) as err:  # cut or corrupt
        raise ValueError(f"{path}: unreadable per-document record ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'cut short'})") from None
    missing = [k for k in ("loss", "edges", "doc_index") if k not in arrays]
    if missing:
        raise ValueError(f"{path}: no {prefix + missing[0]!r} array (a per-document record holds loss, edges, "
                         f"doc_index)")
    rec = DocBins(loss=np.asarray(arrays["loss"], np.float64), edges=np.asarray(arrays["edges"], np.int64),
                  doc_index=np.asarray(arrays["doc_index"], np.int64),
                  bayes=np.asarray(arrays["bayes"], np.float64) if "bayes" in arrays else None,
                  packed=bool(arrays.get("packed", False)))
    for name in ("loss", "bayes"):
        values = getattr(rec, name)
        if values is None:
            continue
        bad_values = ~np.isfinite(values)
        if rec.packed and name == "loss":  # packed rows: NaN is a bin the row does not reach; never an infinity
            bad_values &= ~np.isnan(values)
        if bad_values.any():
            raise ValueError(f"{path}: {prefix + name} holds {int(bad_values.sum())} non-finite value(s) "
                             f"({values[bad_values][0]}); a per-document record must hold finite losses"
                             + ("" if rec.packed else " (rows of packed documents are marked 'packed': evaluate "
                                                      "a packed run made before that again)"))
    n_docs, n_bins = rec.loss.shape if rec.loss.ndim == 2 else (None, None)
    if n_docs is None or rec.edges.shape != (n_bins, 2) or rec.doc_index.shape != (n_docs,) or (
            rec.bayes is not None and rec.bayes.shape != rec.loss.shape):
        raise ValueError(f"{path}: shapes disagree (loss {rec.loss.shape}, edges {rec.edges.shape}, doc_index "
                         f"{rec.doc_index.shape}{'' if rec.bayes is None else f', bayes {rec.bayes.shape}'})")
    return rec


@dataclass(frozen=True)
class Interval:
    """A statistic's value on all documents and its percentile bootstrap interval (arrays for per-bin ones)."""
    estimate: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray
    n_boot: int
    n_seeds: int = 1
    seed_std: float | np.ndarray | None = None   # across-seed standard deviation (ddof=1), 2+ seeds
    seed_min: float | np.ndarray | None = None
    seed_max: float | np.ndarray | None = None


def resample_weights(n_docs: int, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = DEFAULT_SEED) -> np.ndarray:
    """(n_boot + 1, n_docs) weights: row 0 all documents once (the estimate), then n_boot resamples with
    replacement, each row its documents' counts / n_docs."""
    if n_docs < 1:
        raise ValueError(f"n_docs must be >= 1, got {n_docs}")
    if n_boot < 1:
        raise ValueError(f"--bootstrap must be >= 1, got {n_boot}")
    if n_boot * n_docs > MAX_RESAMPLED_DOCS:
        raise ValueError(f"--bootstrap {n_boot}: {n_boot} resamples of {n_docs} documents need "
                         f"{3 * 8 * n_boot * n_docs / 2**30:.1f} GiB; at most {MAX_RESAMPLED_DOCS // n_docs} here")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_docs, size=(n_boot, n_docs))
    flat = (draws + n_docs * np.arange(n_boot)[:, None]).ravel()
    counts = np.bincount(flat, minlength=n_boot * n_docs).reshape(n_boot, n_docs).astype(np.float64)
    return np.vstack([np.ones((1, n_docs)), counts]) / n_docs


def percentile_interval(replicates: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """The (1-level)/2 and (1+level)/2 percentiles of bootstrap replicates along axis 0."""
    tail = 100 * (1 - level) / 2
    return np.percentile(replicates, tail, axis=0), np.percentile(replicates, 100 - tail, axis=0)


# ----- statistics of the mean curves: f(loss_curves (R, n_bins), bayes_curves (R, n_bins) | None, edges) -> (R,...)

def best_bins(curves: np.ndarray, edges: np.ndarray, min_positions: int | None = None) -> np.ndarray:
    """Each curve's best-context bin, as the trainer's `longctx.eval.metrics.best_bin`: the lowest among bins of at
    least `min_positions` positions (default: `min_positions_for` the curves' context). curves (R, n_bins) -> (R,)
    int. Records whose bins are all narrower (made before the rule) take the widest bins. A NaN bin (packed
    documents: one no document reaches) is never taken while the curve has a finite one: as best_bin, a curve with
    no finite wide bin takes its lowest finite bin of any width."""
    widths = edges[:, 1] - edges[:, 0]
    if min_positions is None:
        min_positions = min_positions_for(int(edges[-1, 1]))
    eligible = widths >= min(min_positions, widths.max())
    finite = ~np.isnan(curves)
    wide = eligible[None, :] & finite
    allowed = np.where(wide.any(axis=1, keepdims=True), wide, finite)
    allowed = np.where(allowed.any(axis=1, keepdims=True), allowed, eligible[None, :])
    return np.argmin(np.where(allowed, np.nan_to_num(curves, nan=np.inf), np.inf), axis=1)


def last_fraction_weights(edges: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """Weights over bins that turn a binned curve into its mean over the last `fraction` of the context: each bin
    weighted by how many of its positions lie in the last ceil(fraction * ctx) positions, as a share of them.
    Exact when those positions are whole bins; otherwise a bin's mean stands for its positions there."""
    ctx = int(edges[-1, 1])
    start = ctx - max(1, int(math.ceil(ctx * fraction)))
    overlap = np.clip(np.minimum(edges[:, 1], ctx) - np.maximum(edges[:, 0], start), 0, None).astype(np.float64)
    return overlap / overlap.sum()


def _need_bayes(bayes):
    if bayes is None:
        raise ValueError("a gap to the optimum needs the per-document optimum ('bayes'), which this record lacks")
    return bayes


def stat_curve(loss, bayes, edges):
    return loss


def stat_gap_curve(loss, bayes, edges):
    return loss - _need_bayes(bayes)


def stat_best_context_loss(loss, bayes, edges):
    return np.take_along_axis(loss, best_bins(loss, edges)[:, None], axis=1)[:, 0]


def stat_best_context_gap(loss, bayes, edges):
    """Best-context loss minus the optimum's best-context loss (each curve's own best bin), as icl_summary."""
    bayes = _need_bayes(bayes)
    return stat_best_context_loss(loss, None, edges) - stat_best_context_loss(bayes, None, edges)


def stat_last_bin_gap(loss, bayes, edges):
    return loss[:, -1] - _need_bayes(bayes)[:, -1]


def stat_last_bin_loss(loss, bayes, edges):
    return loss[:, -1]


def stat_last10_loss(loss, bayes, edges):
    return loss @ last_fraction_weights(edges)


def stat_last10_gap(loss, bayes, edges):
    return (loss - _need_bayes(bayes)) @ last_fraction_weights(edges)


STATISTICS: dict[str, Callable] = {
    "curve": stat_curve, "gap_curve": stat_gap_curve, "best_context_loss": stat_best_context_loss,
    "best_context_gap": stat_best_context_gap, "last_bin_gap": stat_last_bin_gap, "last_bin_loss": stat_last_bin_loss,
    "last10_loss": stat_last10_loss, "last10_gap": stat_last10_gap,
}


def _replicates(rec: DocBins, stat: Callable, weights: np.ndarray) -> np.ndarray:
    """Row 0: the statistic on all documents; rows 1..: on each resample."""
    bayes = None if rec.bayes is None else weights @ rec.bayes
    return np.asarray(stat(weights @ rec.loss, bayes, rec.edges))


def _interval(reps: np.ndarray, level: float, **extra) -> Interval:
    low, high = percentile_interval(reps[1:], level)
    return Interval(estimate=_scalar(reps[0]), low=_scalar(low), high=_scalar(high), n_boot=len(reps) - 1, **extra)


def _scalar(x):
    x = np.asarray(x)
    return float(x) if x.ndim == 0 else x


def bootstrap(rec: DocBins, stat: str | Callable, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = DEFAULT_SEED,
              level: float = LEVEL) -> Interval:
    """Percentile bootstrap interval of one run's statistic (a name of STATISTICS or a function of the mean
    curves), resampling its documents.

        >>> bootstrap(load_doc_bins("run/eval/step_00001000.npz"), "best_context_gap").low
    """
    stat = STATISTICS[stat] if isinstance(stat, str) else stat
    return _interval(_replicates(rec, stat, resample_weights(rec.n_docs, n_boot, seed)), level)


def check_paired(a: DocBins, b: DocBins, name_a: str, name_b: str, same_bins: bool = True) -> None:
    """Refuse, naming both runs, to pair evaluations of different documents (or of different bins, with
    same_bins: a per-bin statistic needs them; a one-number statistic such as best-context loss does not)."""
    if same_bins and (a.edges.shape != b.edges.shape or not np.array_equal(a.edges, b.edges)):
        raise ValueError(f"{name_a} and {name_b}: different ICL bins (contexts {a.edges[-1, 1]} and "
                         f"{b.edges[-1, 1]}); a paired difference needs the same bins")
    if a.doc_index.shape != b.doc_index.shape or not np.array_equal(a.doc_index, b.doc_index):
        raise ValueError(f"{name_a} and {name_b}: evaluated on different heldout documents (doc_index differs); "
                         f"a paired difference needs the same documents")


def paired_difference(a: DocBins, b: DocBins, stat: str | Callable, name_a: str = "run a", name_b: str = "run b",
                      n_boot: int = DEFAULT_BOOTSTRAP, seed: int = DEFAULT_SEED, level: float = LEVEL) -> Interval:
    """Interval of stat(a) - stat(b) for two runs evaluated on the same documents: each resample draws the same
    documents for both runs."""
    check_paired(a, b, name_a, name_b)
    stat = STATISTICS[stat] if isinstance(stat, str) else stat
    weights = resample_weights(a.n_docs, n_boot, seed)
    return _interval(_replicates(a, stat, weights) - _replicates(b, stat, weights), level)


def unpaired_difference(a: DocBins, b: DocBins, stat: str | Callable, n_boot: int = DEFAULT_BOOTSTRAP,
                        seed: int = DEFAULT_SEED, level: float = LEVEL) -> Interval:
    """Interval of stat(a) - stat(b) resampling each run's documents independently (runs evaluated on different
    documents; wider than the paired interval when the documents' losses are correlated)."""
    stat = STATISTICS[stat] if isinstance(stat, str) else stat
    reps_a = _replicates(a, stat, resample_weights(a.n_docs, n_boot, seed))
    reps_b = _replicates(b, stat, resample_weights(b.n_docs, n_boot, seed + 1))
    return _interval(reps_a - reps_b, level)


def _seed_replicates(recs: list[DocBins], stat: Callable, n_boot: int, seed: int) -> np.ndarray:
    """(n_seeds, n_boot + 1, ...): each seed's statistic on the joint resamples (same documents for every seed
    when they were evaluated on the same documents; independent resamples otherwise)."""
    same_docs = all(r.doc_index.shape == recs[0].doc_index.shape and np.array_equal(r.doc_index, recs[0].doc_index)
                    for r in recs)
    joint = resample_weights(recs[0].n_docs, n_boot, seed) if same_docs else None
    return np.stack([_replicates(r, stat, joint if same_docs else resample_weights(r.n_docs, n_boot, seed + i))
                     for i, r in enumerate(recs)])


def seed_aggregate(recs: list[DocBins], stat: str | Callable, n_boot: int = DEFAULT_BOOTSTRAP,
                   seed: int = DEFAULT_SEED, level: float = LEVEL) -> Interval:
    """Mean over seeds of a statistic, its interval (documents resampled jointly, the seeds' statistics averaged
    on each resample; see the module docstring) and the seeds' own spread."""
    if not recs:
        raise ValueError("seed_aggregate needs at least one run")
    stat = STATISTICS[stat] if isinstance(stat, str) else stat
    per_seed = _seed_replicates(recs, stat, n_boot, seed)
    spread = {}
    if len(recs) > 1:
        own = per_seed[:, 0]
        spread = {"seed_std": _scalar(own.std(axis=0, ddof=1)), "seed_min": _scalar(own.min(axis=0)),
                  "seed_max": _scalar(own.max(axis=0))}
    return _interval(per_seed.mean(axis=0), level, n_seeds=len(recs), **spread)


def paired_seed_difference(a: list[DocBins], b: list[DocBins], stat: str | Callable, name_a: str = "run a",
                           name_b: str = "run b", n_boot: int = DEFAULT_BOOTSTRAP, seed: int = DEFAULT_SEED,
                           level: float = LEVEL, resample_seeds: bool = False, same_bins: bool = True) -> Interval:
    """Interval of mean_seeds stat(a) - mean_seeds stat(b): every seed of both on the same resamples of the same
    documents (refused, naming the runs, when any of them was evaluated on other documents, or other bins with
    same_bins). resample_seeds: each resample also draws each side's seeds with replacement (module docstring)."""
    for rec in a[1:] + b:
        check_paired(a[0], rec, name_a, name_b, same_bins)
    stat = STATISTICS[stat] if isinstance(stat, str) else stat
    weights = resample_weights(a[0].n_docs, n_boot, seed)
    reps_a = np.stack([_replicates(r, stat, weights) for r in a])  # (seeds, 1 + n_boot, ...)
    reps_b = np.stack([_replicates(r, stat, weights) for r in b])
    if not resample_seeds:
        return _interval(reps_a.mean(axis=0) - reps_b.mean(axis=0), level)
    return _interval(_seed_resampled_mean(reps_a, seed + 1) - _seed_resampled_mean(reps_b, seed + 2), level)


def _seed_resampled_mean(reps: np.ndarray, seed: int) -> np.ndarray:
    """Row 0: the mean over all seeds; row r >= 1: the mean over a draw of the seeds with replacement, each at
    its own value on document resample r."""
    n_seeds, n = reps.shape[0], reps.shape[1]
    draws = np.random.default_rng(seed).integers(0, n_seeds, size=(n - 1, n_seeds))
    cols = np.arange(1, n)[:, None]
    resampled = reps[draws, cols].mean(axis=1)  # (n_boot, ...)
    return np.concatenate([reps.mean(axis=0)[:1], resampled])


def seed_pairs_agreeing(a: list[DocBins], b: list[DocBins], stat: str | Callable) -> tuple[int, int]:
    """(k, n): of the n = len(a) x len(b) seed pairs, how many differ (stat(a_i) - stat(b_j), all documents) in the
    direction of the difference of the seed means."""
    stat = STATISTICS[stat] if isinstance(stat, str) else stat
    one = np.ones((1, a[0].n_docs)) / a[0].n_docs
    va = [float(_replicates(r, stat, one)[0]) for r in a]
    vb = [float(_replicates(r, stat, one)[0]) for r in b]
    sign = np.sign(np.mean(va) - np.mean(vb))
    return sum(int(np.sign(x - y) == sign) for x in va for y in vb), len(va) * len(vb)
