"""The ICL metrics live in longctx.eval.metrics; this name is kept for code that imports them from the trainer."""
from longctx.eval.metrics import (MIN_BEST_BIN_POSITIONS, bin_curve, bin_docs, best_bin, check_bins,  # noqa: F401
                                  exponential_bins, icl_summary, last_fraction_mean, min_positions_for)
