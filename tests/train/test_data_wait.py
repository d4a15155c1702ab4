"""The trainer measures how long each step waited for the data reader: the share goes into every evaluation record,
onto the console line, and past 10% into one warning that says what the reader reads."""
from __future__ import annotations

import json
import time

from longctx.data import LongCrawl64
from longctx.train.trainer import Trainer


def test_a_slow_reader_is_measured_and_named(compose, tiny, tmp_path, monkeypatch):
    read = LongCrawl64.__iter__

    def slow_iter(self):  # a reader that needs 0.3 s a batch, far longer than a tiny CPU step
        for batch in read(self):
            time.sleep(0.3)
            yield batch

    monkeypatch.setattr(LongCrawl64, "__iter__", slow_iter)
    run = tmp_path / "run"
    Trainer(compose(*tiny, "logger.console_every=3", f"run_dir={run}")).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(0.3 < r["data_wait"] <= 1.0 for r in records)
    log = (run / "train.log").read_text()
    assert log.count("waiting for data") == 2                    # both console lines (every 3 of 6 steps)
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
