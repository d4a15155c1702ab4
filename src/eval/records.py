"""The per-document evaluation record: every heldout document's mean loss within each ICL bin, saved as
`<run_dir>/eval/step_XXXXXXXX.npz` beside the run's metrics.jsonl (paired comparisons of runs evaluated on the same
documents -- bootstrap intervals -- need each document's numbers, not only their mean).

Arrays (np.load(path, allow_pickle=False)):
    loss       float32 (n_docs, n_bins)  each document's mean next-token NLL within each bin
    edges      int64 (n_bins, 2)         each bin's [start, end) positions (the record's icl_curve bins)
    bayes      float32 (n_docs, n_bins)  the per-document Bayes-optimal NLL binned the same way (only where the
                                         data has an exact optimum)
    doc_index  int64 (n_docs,)           the heldout documents' indices in the heldout split
    hits       bool (n_docs, Q)          recall data only (MQAR): whether each query was answered right
    distance   int64 (n_docs, Q)         recall data only: each query's distance to its pair, in tokens
    packed     bool ()                   rows of packed documents only (data.pack=true): `loss` is each row's mean
                                         by position within its documents, NaN in a bin where the row has none
The mean over documents of `loss` is the record's icl_curve (every document has the same length; not so for packed
rows, whose curve averages each position over the documents reaching it: the report gives them no interval).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .loss import HeldoutEvaluation, HeldoutLoss

RECORD_DIR = "eval"


def step_record_path(step: int) -> str:
    """The record of the trainer's evaluation at `step`, relative to the run directory."""
    return f"{RECORD_DIR}/step_{step:08d}.npz"


def doc_record(evaluation: HeldoutEvaluation, result: HeldoutLoss) -> dict[str, np.ndarray]:
    arrays = {"loss": result.doc_loss.astype(np.float32),
              "edges": np.asarray(evaluation.edges, dtype=np.int64).reshape(-1, 2),
              "doc_index": evaluation.doc_index.astype(np.int64)}
    if evaluation.bayes_doc_loss is not None:
        arrays["bayes"] = evaluation.bayes_doc_loss.astype(np.float32)
    if result.reached is not None:  # packed rows: NaN marks a bin a row does not reach, not a diverged loss
        arrays["packed"] = np.array(True)
    if result.hits is not None:  # recall data: each query answered right, and its distance to its pair
        arrays["hits"] = result.hits.astype(bool)
        arrays["distance"] = evaluation.queries[:, 1].numpy().astype(np.int64)
    return arrays


def loss_digest(loss) -> str:
    """A short digest of a per-document record's losses as stored (float32): metrics.jsonl keeps it beside the
    record's name, so a file replaced by other losses of the same means is told from the evaluation's own."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(np.asarray(loss, dtype=np.float32)).tobytes()).hexdigest()[:16]


def write_doc_record(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write the arrays to `path` (.npz) through a fresh temporary file renamed into place, so a reader never meets
    half a record."""
    from longctx.train.run_files import open_new, temp_name

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)  # a fresh name, created exclusively: a link planted beside the record is never followed
    try:
        with open_new(tmp) as f:
            np.savez_compressed(f, **arrays)  # a recall record's hits and distances shrink ~4x
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def read_doc_record(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
