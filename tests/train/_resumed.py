"""What the resume tests compare: a stopped, killed or requeued run, once relaunched, logs the evaluation records an
uninterrupted run logs, field for field where the run is deterministic (not its timings)."""
from __future__ import annotations

import json
from pathlib import Path

DETERMINISTIC = ("step", "tokens", "train_loss", "lr", "best_context_loss", "icl_curve", "per_position_loss",
                 "last10_loss", "bayes_curve", "flops")


def records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl, one dict per evaluation."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def assert_same_records(clean: list[dict], resumed: list[dict]) -> None:
    """The same evaluations, every deterministic field equal."""
    assert [r["step"] for r in clean] == [r["step"] for r in resumed]
    for a, b in zip(clean, resumed):
        for key in DETERMINISTIC:
            assert a[key] == b[key], (a["step"], key)
