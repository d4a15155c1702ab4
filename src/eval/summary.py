"""The lines an evaluation prints: one formatter for the trainer's console and `python -m longctx.evaluate`."""
from __future__ import annotations


def optimum_gaps(rec: dict) -> str:
    """The gaps to the Bayes optimum ('' where the data has none)."""
    if "bayes_curve" not in rec:
        return ""
    return (f"gap to the Bayes-optimal loss: last bin {rec['last_bin_gap']:+.4f}, best {rec['best_context_gap']:+.4f}, "
            f"largest {rec['max_bin_gap']:+.4f} (bin ending at {rec['max_bin_gap_position']})")


def eval_line(rec: dict) -> str:
    """One line per evaluation: best-context loss (and its bin), last-10% loss, the gaps to the optimum; on recall
    data the accuracy at the queries and the loss there come first (they are the measure; a run trained with
    data.loss_on=queries never learns the rest of the document)."""
    text = (f"best-context loss {rec['best_context_loss']:.4f} (bin {rec['best_context_bin'][0]}-"
            f"{rec['best_context_bin'][1]}) | last-10% loss {rec['last10_loss']:.4f}")
    if "recall_accuracy" in rec:
        low, high = rec["recall_ci"]
        recall = (f"recall {rec['recall_accuracy']:.1%} [{low:.1%}, {high:.1%}] of {rec['recall_queries']} queries"
                  + (f" (chance {percent(rec['recall_chance'])})" if rec.get("recall_chance") else ""))
        at_queries = f" | loss at the queries {rec['recall_loss']:.4f}" if "recall_loss" in rec else ""
        text = f"{recall}{at_queries} | {text}"
    gaps = optimum_gaps(rec)
    return f"{text} | {gaps}" if gaps else text


def percent(share: float) -> str:
    """A share (the records keep fractions) as a percentage with two significant digits: 0.0041 -> 0.41%."""
    return f"{share * 100:.2g}%"


def retrieval_line(rec: dict) -> str:
    """A retrieval evaluation in one line: mean accuracy over every context and depth, against chance (both in
    percent)."""
    chance = rec["chance"]
    return (f"{rec['task']}: key accuracy {rec['mean_key_accuracy']:.1%} (chance {percent(chance['key'])}), "
            f"digit accuracy {rec['mean_digit_accuracy']:.1%} (chance {percent(chance['digit'])}), "
            f"forced-choice digit accuracy {rec['mean_choice_accuracy']:.1%} (chance {percent(chance['choice'])}) "
            f"over contexts "
            f"{', '.join(str(c) for c in rec['contexts'])} and depths {', '.join(f'{d:g}' for d in rec['depths'])}")
