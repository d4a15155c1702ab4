"""The heldout loss of a model: one batched loop over documents, per-token NLL binned per document.

Every evaluation goes through `nll_batches` (autocast set once, here): the trainer's periodic evaluation (each rank
its share of the documents, summed across ranks by the `reduce` it passes), `python -m longctx.evaluate`, and the
analyses that need every token's loss (`per_token_loss`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from .metrics import bin_docs, check_bins, icl_summary
from .recall import logits_and_nll, query_hits, recall_summary

PRECISIONS = ("auto", "bf16", "fp32")
RECALL_LOGITS_ELEMENTS = 1 << 27  # logits held at once when recall is measured (documents x positions x vocab)


def uses_bf16(device: torch.device | str, precision: str) -> bool:
    """Whether an evaluation at `precision` runs under bf16 autocast: bf16, or auto on CUDA."""
    return precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda")


def autocast(device: torch.device | str, precision: str):
    """bf16 autocast for precision bf16, or auto on CUDA; fp32 (no autocast) otherwise."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    if uses_bf16(device, precision):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights (or, for a module without any, its buffers) live."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


@torch.no_grad()
def nll_batches(model, inputs: torch.Tensor, targets: torch.Tensor, micro_docs: int, precision: str = "auto",
                docs: range | None = None,
                doc_ids: torch.Tensor | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(start, end, nll) for every `micro_docs` documents of `docs` (default all rows) of inputs/targets (n, T):
    nll (end - start, T) float64 on the model's device, the next-token NLL of each token. doc_ids (n, T): rows of
    packed documents (the model's `doc_ids`)."""
    if isinstance(micro_docs, bool) or not isinstance(micro_docs, int) or micro_docs < 1:
        raise ValueError(f"micro_docs={micro_docs!r}: must be a positive integer")
    device = model_device(model)
    docs = range(inputs.shape[0]) if docs is None else docs
    for s in range(docs.start, docs.stop, micro_docs):
        e = min(s + micro_docs, docs.stop)
        packed = {} if doc_ids is None else {"doc_ids": doc_ids[s:e].to(device)}
        with autocast(device, precision):
            nll = model(inputs[s:e].to(device), targets[s:e].to(device), **packed)
        yield s, e, nll.double()


def per_token_loss(model, inputs: torch.Tensor, targets: torch.Tensor, micro_docs: int,
                   precision: str = "auto") -> np.ndarray:
    """Next-token NLL of every token of inputs/targets (n, T) -> (n, T) float64, `micro_docs` documents a forward."""
    return torch.cat([nll.cpu() for *_, nll in nll_batches(model, inputs, targets, micro_docs, precision)]).numpy()


@dataclass
class HeldoutLoss:
    """One evaluation's numbers: the per-position curve and each document's mean NLL within each ICL bin."""
    per_position: np.ndarray   # (T,) float64: mean over documents at each position
    doc_loss: np.ndarray       # (n_docs, n_bins) float64: each document's mean within each bin
    # packed rows: positions are within each document; per_position and doc_loss are NaN where no token falls
    # (no document that long; no document of the row reaching the bin), and `reached` marks the positions with tokens
    summary: dict              # icl_summary of the curve (and of the optimum where known), recall where measured
    hits: np.ndarray | None = None  # (n_docs, Q) bool: each query answered right (data with query positions)
    reached: np.ndarray | None = None  # (T,) bool, packed rows only

    @property
    def reached_curve(self) -> np.ndarray:
        """The per-position losses that are losses: every position, or with packed rows those some document reaches."""
        return self.per_position if self.reached is None else self.per_position[self.reached]

    @property
    def finite(self) -> bool:
        return bool(np.isfinite(self.reached_curve).all())

    @property
    def mean_loss(self) -> float:
        """The heldout loss: the curve's mean over the positions that hold losses."""
        return float(self.reached_curve.mean())


class HeldoutEvaluation:
    """The fixed heldout documents of a run and how they are binned, checked once (before any training):
    `bins_key` names the bin count in errors (trainer.icl_bins, or evaluate's --bins)."""

    def __init__(self, heldout: dict, num_bins: int, bins_key: str = "trainer.icl_bins"):
        self.inputs, self.targets = heldout["inputs"], heldout["targets"]
        n, ctx = self.targets.shape
        self.num_bins, self.bins_key = num_bins, bins_key
        self.edges = check_bins(ctx, num_bins, bins_key)
        self.doc_index = np.arange(n, dtype=np.int64)  # the first n documents of the heldout split (heldout_batch)
        bayes = heldout.get("bayes_nll")  # (n, T) float32, the exact optimum of every token, where known
        self.bayes_curve = None if bayes is None else bayes.double().mean(0).numpy()
        self.bayes_doc_loss = None if bayes is None else bin_docs(bayes.numpy(), self.edges)
        self.doc_ids = heldout.get("doc_ids")  # (n, T) int64: rows of packed documents (data.pack)
        if self.doc_ids is not None and bayes is not None:
            raise ValueError("heldout: packed rows (doc_ids) with a per-token optimum (bayes_nll): no dataset has both")
        self.queries = heldout.get("queries")  # (n, 2, Q) int64: recall data's value positions and distances
        self.n_values = heldout.get("n_values")  # the values a query's answer is drawn from (its chance level)

    @property
    def n_docs(self) -> int:
        return int(self.targets.shape[0])

    def docs_per_forward(self, micro_docs: int) -> int:
        """Documents one forward holds: `micro_docs`, fewer on recall data (the logits of every position are held)."""
        if self.queries is None:
            return micro_docs
        vocab = int(self.inputs.max()) + 1  # the BOS id, the largest of recall data's ids, + 1: the logits' width
        return max(1, min(micro_docs, RECALL_LOGITS_ELEMENTS // (self.targets.shape[1] * max(vocab, 1))))

    def forwards_note(self, micro_docs: int, set_by: str = "--micro-docs") -> str:
        """How the documents are split into forwards, said before the first: progress is counted per forward, and
        one forward of many long documents can take minutes. set_by: where micro_docs came from."""
        per = min(self.docs_per_forward(micro_docs), self.n_docs)
        forwards = -(-self.n_docs // per)
        return (f"in {forwards} forward{'s' * (forwards != 1)} of up to {per}, set by {set_by}; progress is "
                f"counted per forward")

    @torch.no_grad()
    def run(self, model, micro_docs: int, precision: str = "auto", docs: range | None = None,
            reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
            on_batch: Callable[[int], None] | None = None) -> HeldoutLoss:
        """Evaluate `model` on the documents `docs` (default all; with several ranks, this rank's share), summed
        over every rank by `reduce` (an all-reduce sum; None on one process). on_batch(docs done) after each
        forward, e.g. a progress bar."""
        n, ctx = self.targets.shape
        device = model_device(model)
        bin_of = torch.empty(ctx, dtype=torch.long, device=device)
        for i, (a, b) in enumerate(self.edges):
            bin_of[a:b] = i
        widths = torch.tensor([b - a for a, b in self.edges], dtype=torch.float64, device=device)
        total = torch.zeros(ctx, dtype=torch.float64, device=device)
        doc_loss = torch.zeros(n, len(self.edges), dtype=torch.float64, device=device)
        hits = None if self.queries is None else torch.zeros(n, self.queries.shape[-1], dtype=torch.float64,
                                                               device=device)
        query_nll = None if hits is None else torch.zeros_like(hits)  # the NLL of each queried value
        count = None if self.doc_ids is None else torch.zeros(ctx, dtype=torch.float64, device=device)
        for s, e, nll in self._batches(model, micro_docs, precision, docs, hits):
            if query_nll is not None:
                query_nll[s:e] = nll.gather(1, self.queries[s:e, 0].to(device))
            if count is not None:  # packed rows: by position within each document
                self._packed_sums(nll, self.doc_ids[s:e].to(device), bin_of, total, count, doc_loss[s:e])
            else:
                total += nll.sum(0)
                doc_loss[s:e] = torch.zeros(e - s, len(self.edges), dtype=torch.float64,
                                            device=device).index_add_(1, bin_of, nll) / widths
            if on_batch is not None:
                on_batch(e - s)
        if reduce is not None:
            total, doc_loss = reduce(total), reduce(doc_loss)
            hits = None if hits is None else reduce(hits)
            query_nll = None if query_nll is None else reduce(query_nll)
            count = None if count is None else reduce(count)
        per_position = (total / (n if count is None else count)).cpu().numpy()  # packed: 0 / 0 = NaN, not reached
        reached = None if count is None else (count > 0).cpu().numpy()
        summary = icl_summary(per_position, self.num_bins, self.bayes_curve, key=self.bins_key, reached=reached)
        if hits is not None:
            hits = hits.cpu().numpy() > 0.5
            summary.update(recall_summary(hits, self.queries[:, 1].numpy(), self.n_values))
            summary["recall_loss"] = float(query_nll.mean())  # the loss data.loss_on=queries trains on
        return HeldoutLoss(per_position=per_position, doc_loss=doc_loss.cpu().numpy(), summary=summary, hits=hits,
                           reached=reached)

    @staticmethod
    def _packed_sums(nll, doc_ids, bin_of, total, count, doc_loss):
        """Add packed rows' NLL (m, T) into total and count (T,) by position within each document, and write each
        row's mean within each bin of those positions into doc_loss (m, n_bins) (NaN where no token falls)."""
        from longctx.models.common import doc_positions
        pos = doc_positions(doc_ids)                                              # (m, T)
        total.index_add_(0, pos.flatten(), nll.flatten())
        count.index_add_(0, pos.flatten(), torch.ones_like(nll).flatten())
        bins = bin_of[pos]                                                        # (m, T)
        sums = torch.zeros_like(doc_loss).scatter_add_(1, bins, nll)
        doc_loss.copy_(sums / torch.zeros_like(doc_loss).scatter_add_(1, bins, torch.ones_like(nll)))

    def _batches(self, model, micro_docs: int, precision: str, docs: range | None, hits: torch.Tensor | None):
        """nll_batches, or on recall data one forward for the logits (fewer documents a forward: the logits of
        every position are held) that fills `hits` at the queries and gives the same NLL."""
        if hits is None:
            yield from nll_batches(model, self.inputs, self.targets, micro_docs, precision, docs, self.doc_ids)
            return
        docs = range(self.n_docs) if docs is None else docs
        step = self.docs_per_forward(micro_docs)
        device = model_device(model)
        for s in range(docs.start, docs.stop, step):
            e = min(s + step, docs.stop)
            targets = self.targets[s:e].to(device)
            with autocast(device, precision):
                logits, nll = logits_and_nll(model, self.inputs[s:e].to(device), targets)
            hits[s:e] = query_hits(logits, targets, self.queries[s:e]).double()
            yield s, e, nll
