"""The paper's long-context metrics: per-position loss, the binned ICL curve, best-context loss.

Definitions follow the paper's appendix ("Experimental details"): the per-position heldout loss is smoothed
by binning positions into exponentially growing bins (equal widths on a log axis); the best-context loss is
the minimum of that binned curve. We also report the mean loss over the last 10% of the context.

The best bin is chosen only among bins holding at least `min_positions_for(ctx)` positions (16, or ctx/8 at
contexts under 128 tokens): the first bins hold one position each, whose mean over a few heldout documents is
too noisy to be a context's loss (a lucky position would be reported as the best context). A bin count that
leaves no bin that wide is refused (`check_bins`), naming the key that set it. The best bin's position -- its
end, the context length it stands for, as the paper's best-context table writes it -- is reported with it.
"""
from __future__ import annotations

import math

import numpy as np

MIN_BEST_BIN_POSITIONS = 16  # a bin narrower than this never counts as the best context (ctx >= 128)


def min_positions_for(ctx: int) -> int:
    """Positions a bin must hold to count as a best context: 16, or ctx/8 for contexts under 128 tokens (a tiny
    context has no 16-position bin to offer; its widest bins are still far wider than one position)."""
    return max(1, min(MIN_BEST_BIN_POSITIONS, ctx // 8))


def exponential_bins(ctx: int, num_bins: int, key: str = "trainer.icl_bins") -> list[tuple[int, int]]:
    """Half-open position bins [start, end) covering 0..ctx-1 whose edges grow geometrically.

    Edges are round(ctx ** (i / num_bins)) for i = 0..num_bins, made strictly increasing, so the first
    bins are single positions and later bins widen; duplicate edges at small positions are merged, so
    fewer than `num_bins` bins may come back for short contexts. `key` names the setting in errors.
    """
    if ctx < 1:
        raise ValueError(f"ctx must be >= 1, got {ctx}")
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"{key}={num_bins!r}: must be a positive integer")
    edges = sorted({0} | {min(ctx, int(round(ctx ** (i / num_bins)))) for i in range(num_bins + 1)})
    if edges[-1] != ctx:
        edges.append(ctx)
    return [(a, b) for a, b in zip(edges[:-1], edges[1:])]


def check_bins(ctx: int, num_bins: int, key: str = "trainer.icl_bins",
               min_positions: int | None = None) -> list[tuple[int, int]]:
    """exponential_bins(ctx, num_bins), refused (naming `key`) when no bin is wide enough to be a best context."""
    bins = exponential_bins(ctx, num_bins, key)
    need = min_positions_for(ctx) if min_positions is None else min_positions
    if need < 1:
        raise ValueError(f"min_positions must be >= 1, got {need}")
    widest = max(b - a for a, b in bins)
    if widest < need:
        fit = max(n for n in range(1, num_bins + 1)
                  if max(b - a for a, b in exponential_bins(ctx, n, key)) >= need)
        raise ValueError(f"{key}={num_bins}: at ctx={ctx} its widest bin holds {widest} positions, fewer than the "
                         f"{need} a best-context bin needs; use {key}={fit} or fewer")
    return bins


def bin_curve(per_position: np.ndarray, bins: list[tuple[int, int]], reached: np.ndarray | None = None) -> np.ndarray:
    """Mean of a per-position curve (ctx,) inside each bin -> (num_bins,). reached (ctx,) bool: the positions that
    hold a loss (packed documents: positions no document reaches are left out; a bin of none is NaN)."""
    per_position = np.asarray(per_position, dtype=np.float64)
    if reached is None:
        return np.array([per_position[a:b].mean() for a, b in bins])
    return np.array([_mean(per_position[a:b][reached[a:b]]) for a, b in bins])


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else math.nan


def bin_docs(per_token: np.ndarray, bins: list[tuple[int, int]]) -> np.ndarray:
    """Each document's mean within each bin: (n_docs, ctx) -> (n_docs, num_bins) float64."""
    per_token = np.asarray(per_token)  # float32 stays float32 in memory; each bin's mean accumulates in float64
    return np.stack([per_token[:, a:b].mean(1, dtype=np.float64) for a, b in bins], axis=1)


def last_fraction_mean(per_position: np.ndarray, fraction: float = 0.1, reached: np.ndarray | None = None) -> float:
    """Mean loss over the last `fraction` of the context (at least one position); reached: as bin_curve's."""
    per_position = np.asarray(per_position, dtype=np.float64)
    n = max(1, int(math.ceil(len(per_position) * fraction)))
    return float(per_position[-n:].mean()) if reached is None else _mean(per_position[-n:][reached[-n:]])


def best_bin(binned: np.ndarray, bins: list[tuple[int, int]], min_positions: int, skip_nan: bool = False) -> int:
    """Index of the lowest bin among those holding >= min_positions positions (check_bins makes sure one does).
    skip_nan: leave out NaN bins (packed documents: bins no document reaches); where no wide bin is reached (documents
    all shorter than the first wide bin), the lowest reached bin of any width, never a NaN one while one is reached."""
    widths = np.array([b - a for a, b in bins])
    wide = widths >= min_positions
    finite = ~np.isnan(np.asarray(binned, dtype=np.float64))
    candidates = np.flatnonzero(wide)
    if skip_nan and finite.any():
        candidates = np.flatnonzero(wide & finite if (wide & finite).any() else finite)
    if not len(candidates):
        raise ValueError(f"no bin holds {min_positions} positions (widest {widths.max()}): too many bins")
    return int(candidates[np.argmin(np.asarray(binned)[candidates])])


def icl_summary(per_position: np.ndarray, num_bins: int, bayes_per_position: np.ndarray | None = None,
                min_bin_positions: int | None = None, key: str = "trainer.icl_bins",
                reached: np.ndarray | None = None) -> dict:
    """Everything logged per evaluation, from one per-position loss curve (and the optimum if known).
    min_bin_positions: the width a best-context bin needs (default `min_positions_for(ctx)`). reached (ctx,) bool:
    packed documents' positions that hold a loss (by position within each document); the others are left out."""
    per_position = np.asarray(per_position, dtype=np.float64)
    ctx = len(per_position)
    need = min_positions_for(ctx) if min_bin_positions is None else min_bin_positions
    bins = check_bins(ctx, num_bins, key, need)
    binned = bin_curve(per_position, bins, reached)
    best = best_bin(binned, bins, need, skip_nan=reached is not None)
    out = {
        "icl_curve": [[a, b, float(v)] for (a, b), v in zip(bins, binned)],
        "best_context_loss": float(binned[best]),
        "best_context_bin": list(bins[best]),
        "best_context_position": int(bins[best][1]),
        "last10_loss": last_fraction_mean(per_position, reached=reached),
        "mean_loss": float(per_position.mean()) if reached is None else _mean(per_position[reached]),
    }
    if bayes_per_position is not None:
        bayes_binned = bin_curve(bayes_per_position, bins)
        out["bayes_curve"] = [[a, b, float(v)] for (a, b), v in zip(bins, bayes_binned)]
        out["bayes_best_context_loss"] = float(bayes_binned[best_bin(bayes_binned, bins, need)])
        out["bayes_last10_loss"] = last_fraction_mean(bayes_per_position)
        out["last_bin_gap"] = float(binned[-1] - bayes_binned[-1])
        out["best_context_gap"] = out["best_context_loss"] - out["bayes_best_context_loss"]
        # the whole curve near the optimum (the task's calibration target): the largest gap over the bins
        gaps = np.asarray(binned) - np.asarray(bayes_binned)
        out["max_bin_gap"] = float(gaps.max())
        out["max_bin_gap_position"] = int(bins[int(gaps.argmax())][1])
    return out
