"""What lm-eval calls back for the longctx tasks (the task YAMLs name these as `!function longctx.hf.harness...`).

Each document's `process_results` returns the task's pooled metric and the one cell (position bin, or context and
depth) the document belongs to; a cell's aggregation sees only its own documents' items (the metric is absent from
the others: lm-eval aggregates the items each metric received).
"""
from __future__ import annotations

import math


def heldout_results(doc: dict, results: list) -> dict:
    """A document's tokens [start, end): the loglikelihood of its text up to `end` less that up to `start` (both read
    after BOS, so the difference is exactly the log-probability of the bin's tokens given everything before them)."""
    lls = [ll for ll, _greedy in results]
    ll = lls[-1] - (lls[0] if len(lls) == 2 else 0.0)
    item = (ll, doc["tokens"])
    return {"nll": item, "bits_per_byte": (ll, doc["bytes"]), doc["cell"]: item}


def token_nll(items: list) -> float:
    """Mean negative log-likelihood per token (nats) over (loglikelihood, tokens) items: longctx's heldout loss."""
    return -sum(ll for ll, _ in items) / sum(n for _, n in items)


def retrieval_results(doc: dict, results: list) -> dict:
    """Exact match of the greedy continuation with the key (the key's tokens only are generated)."""
    hit = float(results[0] == doc["target"])
    return {"exact_match": hit, doc["cell"]: hit}


def recall_results(doc: dict, results: list) -> dict:
    """An MQAR query is answered when the value is the argmax after its key (lm-eval's is_greedy)."""
    _ll, greedy = results[0]
    return {"acc": float(greedy), doc["cell"]: float(greedy)}


def mean(items: list) -> float:
    return sum(items) / len(items) if items else math.nan
