"""Evaluation: the heldout loss loop, the ICL metrics, the per-document record, retrieval tasks, summary lines.

Used by the trainer's periodic evaluation and by `python -m longctx.evaluate`; docs/evaluate.md describes both.
"""
from .loss import HeldoutEvaluation, HeldoutLoss, autocast, nll_batches, per_token_loss
from .metrics import (MIN_BEST_BIN_POSITIONS, bin_curve, bin_docs, check_bins, exponential_bins, icl_summary,
                      last_fraction_mean, min_positions_for)
from .records import doc_record, read_doc_record, step_record_path, write_doc_record
from .retrieval import TASKS, Alphabet, alphabet_for, run_retrieval
from .summary import eval_line, optimum_gaps, retrieval_line

__all__ = ["HeldoutEvaluation", "HeldoutLoss", "autocast", "nll_batches", "per_token_loss",
           "MIN_BEST_BIN_POSITIONS", "bin_curve", "bin_docs", "check_bins", "exponential_bins", "icl_summary",
           "last_fraction_mean", "min_positions_for", "doc_record", "read_doc_record", "step_record_path",
           "write_doc_record", "TASKS", "Alphabet", "alphabet_for", "run_retrieval", "eval_line", "optimum_gaps",
           "retrieval_line"]
