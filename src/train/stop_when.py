"""trainer.stop_when: end a run at the first evaluation whose metric meets a bound, e.g. `recall_accuracy>=0.99` for
a curriculum stage that has learned what it is there for (the recall recipe's first stage: softmax gets there in
~500 updates, other arms in 750-1,250 or later, so one fixed length either wastes the fast arms' time or stops the
slow ones before they leave the plateau). The run is complete from then on: a relaunch does nothing, and raising the
bound (or clearing it) lets it train on toward trainer.max_steps.

    "trainer.stop_when='recall_accuracy>=0.99'"    # METRIC>=VALUE or METRIC<=VALUE, METRIC a key of the evaluation
    "trainer.stop_when='best_context_gap<=0.05'"   # record in metrics.jsonl (in a shell: the single quotes reach Hydra)
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

_FORM = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
EVERY_DATASET = ("heldout_loss", "best_context_loss", "last10_loss", "mean_loss", "train_loss", "heldout_minus_train")
RECALL_DATA = ("recall_accuracy", "recall_loss")                                # data=mqar only
WITH_OPTIMUM = ("best_context_gap", "last_bin_gap", "max_bin_gap")             # data with a known optimum only


@dataclass(frozen=True)
class StopWhen:
    metric: str
    op: str       # ">=" or "<="
    bound: float

    def met(self, record: dict) -> bool:
        value = record.get(self.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_stop_when(value, data_name: str | None = None) -> StopWhen | None:
    """trainer.stop_when as a StopWhen (None: unset); a bad one is ValueError naming the key, with what it can be.
    data_name: the run's data option, to refuse a metric its evaluations never record."""
    if value is None:
        return None
    known = EVERY_DATASET + RECALL_DATA + WITH_OPTIMUM
    match = _FORM.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"config: trainer.stop_when={value!r}: expected METRIC>=VALUE or METRIC<=VALUE, e.g. "
                         f"'recall_accuracy>=0.99' (METRIC one of {', '.join(known)})")
    metric, op, bound = match.group(1), match.group(2), float(match.group(3))
    if metric not in known:
        raise ValueError(f"config: trainer.stop_when={value!r}: {metric} is not an evaluation metric "
                         f"(one of {', '.join(known)})")
    if data_name is not None:
        if metric in RECALL_DATA and data_name != "mqar":
            raise ValueError(f"config: trainer.stop_when={value!r}: {metric} is recorded on recall data only "
                             f"(data=mqar), not data={data_name}")
        if metric in WITH_OPTIMUM and not data_name.startswith("icl_markov"):
            raise ValueError(f"config: trainer.stop_when={value!r}: {metric} needs data with a known optimum "
                             f"(data=icl_markov*), not data={data_name}")
    return StopWhen(metric, op, bound)
