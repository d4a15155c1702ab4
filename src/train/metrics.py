"""The paper's long-context metrics: per-position loss, the binned ICL curve, best-context loss.

Definitions follow the paper's appendix ("Experimental details"): the per-position heldout loss is smoothed
by binning positions into exponentially growing bins (equal widths on a log axis); the best-context loss is
the minimum of that binned curve. We also report the mean loss over the last 10% of the context.

The best bin is chosen among bins holding at least `MIN_BEST_BIN_POSITIONS` positions: the first bins hold one
position each, whose mean over a few heldout documents is too noisy to be a context's loss (a lucky position
would be reported as the best context). Its position -- the bin's end, the context length it stands for, as the
paper's best-context table writes it -- is reported with it.
"""
from __future__ import annotations

import math

import numpy as np

MIN_BEST_BIN_POSITIONS = 16  # bins narrower than this never count as the best context (if a wider one exists)


def exponential_bins(ctx: int, num_bins: int) -> list[tuple[int, int]]:
    """Half-open position bins [start, end) covering 0..ctx-1 whose edges grow geometrically.

    Edges are round(ctx ** (i / num_bins)) for i = 0..num_bins, made strictly increasing, so the first
    bins are single positions and later bins widen; duplicate edges at small positions are merged, so
    fewer than `num_bins` bins may come back for short contexts.
    """
    if ctx < 1:
        raise ValueError(f"ctx must be >= 1, got {ctx}")
    if num_bins < 1:
        raise ValueError(f"trainer.icl_bins must be >= 1, got {num_bins}")
    edges = sorted({0} | {min(ctx, int(round(ctx ** (i / num_bins)))) for i in range(num_bins + 1)})
    if edges[-1] != ctx:
        edges.append(ctx)
    return [(a, b) for a, b in zip(edges[:-1], edges[1:])]


def bin_curve(per_position: np.ndarray, bins: list[tuple[int, int]]) -> np.ndarray:
    """Mean of a per-position curve (ctx,) inside each bin -> (num_bins,)."""
    per_position = np.asarray(per_position, dtype=np.float64)
    return np.array([per_position[a:b].mean() for a, b in bins])


def last_fraction_mean(per_position: np.ndarray, fraction: float = 0.1) -> float:
    """Mean loss over the last `fraction` of the context (at least one position)."""
    per_position = np.asarray(per_position, dtype=np.float64)
    n = max(1, int(math.ceil(len(per_position) * fraction)))
    return float(per_position[-n:].mean())


def best_bin(binned: np.ndarray, bins: list[tuple[int, int]], min_positions: int = MIN_BEST_BIN_POSITIONS) -> int:
    """Index of the lowest bin among those holding >= min_positions positions (or, when no bin is that wide, among
    the widest ones)."""
    if min_positions < 1:
        raise ValueError(f"min_positions must be >= 1, got {min_positions}")
    widths = np.array([b - a for a, b in bins])
    eligible = widths >= min(min_positions, widths.max())
    candidates = np.flatnonzero(eligible)
    return int(candidates[np.argmin(np.asarray(binned)[candidates])])


def icl_summary(per_position: np.ndarray, num_bins: int, bayes_per_position: np.ndarray | None = None,
                min_bin_positions: int = MIN_BEST_BIN_POSITIONS) -> dict:
    """Everything logged per evaluation, from one per-position loss curve (and the optimum if known)."""
    per_position = np.asarray(per_position, dtype=np.float64)
    bins = exponential_bins(len(per_position), num_bins)
    binned = bin_curve(per_position, bins)
    best = best_bin(binned, bins, min_bin_positions)
    out = {
        "icl_curve": [[a, b, float(v)] for (a, b), v in zip(bins, binned)],
        "best_context_loss": float(binned[best]),
        "best_context_bin": list(bins[best]),
        "best_context_position": int(bins[best][1]),
        "last10_loss": last_fraction_mean(per_position),
        "mean_loss": float(per_position.mean()),
    }
    if bayes_per_position is not None:
        bayes_binned = bin_curve(bayes_per_position, bins)
        out["bayes_curve"] = [[a, b, float(v)] for (a, b), v in zip(bins, bayes_binned)]
        out["bayes_best_context_loss"] = float(bayes_binned[best_bin(bayes_binned, bins, min_bin_positions)])
        out["bayes_last10_loss"] = last_fraction_mean(bayes_per_position)
        out["last_bin_gap"] = float(binned[-1] - bayes_binned[-1])
        out["best_context_gap"] = out["best_context_loss"] - out["bayes_best_context_loss"]
        # the whole curve near the optimum (the task's calibration target): the largest gap over the bins
        gaps = np.asarray(binned) - np.asarray(bayes_binned)
        out["max_bin_gap"] = float(gaps.max())
        out["max_bin_gap_position"] = int(bins[int(gaps.argmax())][1])
    return out
