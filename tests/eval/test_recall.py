"""Recall accuracy (MQAR) measured at the query positions only: an oracle that reads the pairs scores exactly 1, a
constant guess exactly its share of the answers, the pooled interval is Wilson's, and the per-document record
recomputes the logged accuracy."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from longctx.data import heldout_batch
from longctx.data.mqar import ensure_mqar, token_ids
from longctx.eval.loss import HeldoutEvaluation
from longctx.eval.records import doc_record
from longctx.eval.recall import distance_edges, wilson_interval

PARAMS = dict(n_keys=40, n_values=12, n_pairs=10, n_queries=10, doc_len=128, n_train=8, n_heldout=16)
IDS = token_ids(dict(PARAMS, distance="power", power_a=0.01, seed=0, name="mqar", version=1))


class Oracle(torch.nn.Module):
    """Logits from the inputs alone (BOS first): after a key that follows the pairs, that key's value."""

    def forward(self, input_ids, targets=None):
        b, t = input_ids.shape
        guess = torch.full((b, t), IDS["filler"], dtype=torch.long)
        for i in range(b):
            doc = input_ids[i, 1:].tolist()              # doc[j] is token j
            pairs = {doc[2 * j]: doc[2 * j + 1] for j in range(PARAMS["n_pairs"])}
            for pos in range(2 * PARAMS["n_pairs"] + 1, t):
                if input_ids[i, pos] < PARAMS["n_keys"]:
                    guess[i, pos] = pairs[int(input_ids[i, pos])]
        logits = 20.0 * F.one_hot(guess, IDS["vocab_size"]).float()
        if targets is None:
            return logits
        return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


class Constant(Oracle):
    def forward(self, input_ids, targets=None):
        logits = torch.zeros(*input_ids.shape, IDS["vocab_size"])
        logits[..., PARAMS["n_keys"] + 5] = 1.0
        return logits if targets is None else F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    root = ensure_mqar(tmp_path_factory.mktemp("mqar"), progress=False, **PARAMS)
    return heldout_batch(root / "heldout.zarr", PARAMS["doc_len"], PARAMS["n_heldout"])


def test_wilson_interval_matches_its_closed_form():
    # Wilson (1927) for 8 of 10 at z = 1.96: (0.4902, 0.9433) (e.g. Newcombe 1998, Table I's method 3)
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_oracle_recalls_everything_and_a_constant_scores_its_share(heldout):
    evaluation = HeldoutEvaluation(heldout, num_bins=4)
    perfect = evaluation.run(Oracle(), micro_docs=5)
    assert perfect.summary["recall_accuracy"] == 1.0 and perfect.hits.all()
    assert perfect.summary["recall_queries"] == PARAMS["n_heldout"] * PARAMS["n_queries"]
    assert perfect.summary["recall_chance"] == pytest.approx(1 / PARAMS["n_values"])
    constant = evaluation.run(Constant(), micro_docs=3)
    pos = heldout["queries"][:, 0]
    answers = heldout["targets"].gather(1, pos)
    share = (answers == PARAMS["n_keys"] + 5).double().mean().item()
    assert constant.summary["recall_accuracy"] == pytest.approx(share, abs=1e-12)
    low, high = constant.summary["recall_ci"]
    assert (low, high) == wilson_interval(int(round(share * answers.numel())), answers.numel())
    # the loss is the same one the NLL path computes (one forward gives both)
    nll = Constant()(heldout["inputs"], heldout["targets"]).double()
    assert np.allclose(constant.per_position, nll.mean(0).numpy(), atol=1e-6)
    # recall_loss: the NLL at the queried values only (what data.loss_on=queries trains on)
    at_queries = nll.gather(1, pos).mean().item()
    assert constant.summary["recall_loss"] == pytest.approx(at_queries, abs=1e-9)
    assert perfect.summary["recall_loss"] == pytest.approx(0.0, abs=1e-6)


def test_the_record_recomputes_the_accuracy_and_its_distance_bins(heldout):
    evaluation = HeldoutEvaluation(heldout, num_bins=4)
    result = evaluation.run(Constant(), micro_docs=16)
    record = doc_record(evaluation, result)
    assert record["hits"].shape == record["distance"].shape == (PARAMS["n_heldout"], PARAMS["n_queries"])
    assert record["hits"].mean() == pytest.approx(result.summary["recall_accuracy"], abs=1e-12)
    edges = distance_edges(int(record["distance"].max()))
    for a, b, accuracy, count in result.summary["recall_by_distance"]:
        inside = (record["distance"] >= a) & (record["distance"] < b)
        assert [a, b] in [[x, y] for x, y in zip(edges[:-1], edges[1:])]
        assert count == inside.sum() and accuracy == pytest.approx(record["hits"][inside].mean())
    assert sum(c for *_, c in result.summary["recall_by_distance"]) == record["hits"].size


def test_a_context_shorter_than_the_queries_is_refused(heldout, tmp_path):
    root = ensure_mqar(tmp_path, progress=False, **PARAMS)
    last = int(heldout["queries"][:4, 0].max())  # the first 4 documents' last query
    with pytest.raises(ValueError, match=f"ctx={last}: the heldout documents ask queries up to position {last}"):
        heldout_batch(root / "heldout.zarr", last, 4)


def test_the_evaluation_line_says_the_recall(heldout):
    from longctx.eval import eval_line

    result = HeldoutEvaluation(heldout, num_bins=4).run(Oracle(), micro_docs=16)
    rec = {**result.summary}
    line = eval_line(rec)
    assert line.startswith(f"recall 100.0% [{rec['recall_ci'][0]:.1%}, 100.0%] of 160 queries (chance 8.3%) | "
                           f"loss at the queries {rec['recall_loss']:.4f} | best-context loss")
