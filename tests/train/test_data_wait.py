"""The trainer measures how long each step waited for the data reader: the share goes into every evaluation record,
onto the console line, and past 10% into one warning that says what the reader reads."""
from __future__ import annotations

import json

from longctx.data import LongCrawl64
from longctx.train import trainer as trainer_module
from longctx.train.trainer import Trainer


class Clock:
    """The trainer's clock (its `time` module), advanced only by the fake reader and step below: the shares are
    exact whatever the machine's load."""

    def __init__(self):
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    perf_counter = monotonic = time  # durations: the same fake time


def test_a_slow_reader_is_measured_and_named(compose, tiny, tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(trainer_module, "time", clock)
    read, step = LongCrawl64.__iter__, Trainer.train_step

    def slow_iter(self):  # a reader that needs 0.3 s a batch ...
        for batch in read(self):
            clock.now += 0.3
            yield batch

    def quick_step(self, batch):  # ... for a 0.01 s step
        loss = step(self, batch)
        clock.now += 0.01
        return loss

    monkeypatch.setattr(LongCrawl64, "__iter__", slow_iter)
    monkeypatch.setattr(Trainer, "train_step", quick_step)
    run = tmp_path / "run"
    # no checkpointing probe: it would take the first batch before the loop measures the wait
    Trainer(compose(*tiny, "logger.console_every=3", "trainer.activation_checkpointing=false",
                    f"run_dir={run}")).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["data_wait"] for r in records] == [round(0.3 / 0.31, 4)] * 2
    log = (run / "train.log").read_text()
    assert log.count("waiting for data 97%") == 2                # both console lines (every 3 of 6 steps)
    assert log.count("training waited for the data reader") == 1  # one warning per run
    # the tiny dataset's 1024-token documents are one chunk long: 64-token windows decode 16x what they use
    assert "each 64-token window decodes 1024-token chunks" in log


def test_the_warning_follows_the_measured_share(compose, tiny, tmp_path):
    """With the real read-ahead the share is measured as it comes (near 0 on an idle machine); the warning appears
    exactly when an evaluation window's share reached 10%."""
    run = tmp_path / "run"
    Trainer(compose(*tiny, f"run_dir={run}")).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(0.0 <= r["data_wait"] < 1.0 for r in records)
    warned = "training waited for the data reader" in (run / "train.log").read_text()
    assert warned == any(r["data_wait"] >= 0.1 for r in records)
