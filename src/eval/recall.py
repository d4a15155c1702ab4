"""Recall accuracy on a dataset with query positions (MQAR, `longctx.data.mqar`): exact accuracy at the queries only.

A query is answered right when the model's most likely next token at the query's value position is the value (the
loss elsewhere, on random keys and filler, is not the measure). Each document's accuracy is kept (the per-document
record the report pairs and bootstraps); the pooled accuracy carries a Wilson 95% interval over the queries, and
accuracy is also binned by the distance from the pair to its query (the recall analogue of the ICL curve).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

Z95 = 1.959963984540054


def wilson_interval(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion hits / n (Wilson 1927); (nan, nan) when n = 0."""
    if n <= 0:
        return math.nan, math.nan
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def distance_edges(max_distance: int, num_bins: int = 8) -> list[int]:
    """Bin edges over query distances 1..max_distance, growing geometrically (the ICL curve's binning)."""
    top = max(2, int(max_distance) + 1)
    return sorted({1} | {int(round(top ** (i / num_bins))) for i in range(1, num_bins + 1)} | {top})


def logits_and_nll(model, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward for both: logits (b, t, vocab) and the next-token NLL (b, t) float64 of `targets`."""
    logits = model(inputs)
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none").double()
    return logits, nll


def query_hits(logits: torch.Tensor, targets: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """(b, Q) bool: whether the argmax at each query's value position is the value; queries (b, 2, Q) as stored."""
    pos = queries[:, 0].to(logits.device)
    guess = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1])).argmax(-1)  # (b, Q)
    return guess == targets.gather(1, pos)


def recall_summary(hits: np.ndarray, distances: np.ndarray, n_values: int | None) -> dict:
    """hits, distances (n_docs, Q) -> the record's recall fields: pooled accuracy with its Wilson interval, the
    per-document mean, accuracy by distance bin, the chance level of a guess among the values."""
    hits, distances = np.asarray(hits, dtype=bool), np.asarray(distances)
    n = int(hits.size)
    low, high = wilson_interval(int(hits.sum()), n)
    edges = distance_edges(int(distances.max()) if n else 1)
    by_distance = []
    for a, b in zip(edges[:-1], edges[1:]):
        inside = (distances >= a) & (distances < b)
        if inside.any():
            by_distance.append([a, b, float(hits[inside].mean()), int(inside.sum())])
    return {"recall_accuracy": float(hits.mean()) if n else math.nan, "recall_ci": [low, high],
            "recall_queries": n, "recall_chance": None if not n_values else 1.0 / n_values,
            "recall_by_distance": by_distance}
