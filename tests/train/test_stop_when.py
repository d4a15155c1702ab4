"""trainer.stop_when: a run ends at the first evaluation whose metric meets the bound, is complete from then on, and
trains on when the bound is cleared; a bad bound is one line naming the key, before anything is written."""
from __future__ import annotations

import json

import pytest

from longctx.report.runs import load_run
from longctx.train.config import validate
from longctx.train.stop_when import StopWhen, parse_stop_when
from longctx.train.trainer import Trainer


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_bound_is_read_as_written():
    assert parse_stop_when("recall_accuracy>=0.99") == StopWhen("recall_accuracy", ">=", 0.99)
    assert parse_stop_when(" best_context_gap <= 5e-2 ") == StopWhen("best_context_gap", "<=", 0.05)
    assert parse_stop_when(None) is None
    at_least, at_most = StopWhen("recall_accuracy", ">=", 0.9), StopWhen("heldout_loss", "<=", 1.5)
    assert at_least.met({"recall_accuracy": 0.9}) and not at_least.met({"recall_accuracy": 0.8999})
    assert at_most.met({"heldout_loss": 1.5}) and not at_most.met({"heldout_loss": 1.51})
    assert not at_least.met({}) and not at_least.met({"recall_accuracy": float("nan")})


@pytest.mark.parametrize("value, data, why", [
    ("recall_accuracy>0.9", "icl_markov", "expected METRIC>=VALUE or METRIC<=VALUE"),
    ("recall_accuracy>=high", "mqar", "expected METRIC>=VALUE"),
    ("accuracy>=0.9", "mqar", "accuracy is not an evaluation metric"),
    ("recall_accuracy>=0.9", "icl_markov", "recorded on recall data only"),
    ("best_context_gap<=0.05", "mqar", "needs data with a known optimum"),
])
def test_a_bad_bound_names_the_key(compose, value, data, why):
    with pytest.raises(ValueError, match="^config: trainer[.]stop_when=") as err:
        validate(compose(f"data={data}", f"trainer.stop_when='{value}'"))
    assert why in str(err.value)


def test_a_run_stops_when_met_stays_complete_and_trains_on_once_cleared(compose, tiny, tmp_path, capsys):
    run = tmp_path / "run"
    met = [*tiny, "trainer.stop_when='heldout_loss<=1000'", f"run_dir={run}"]   # met at the first evaluation
    capsys.readouterr()
    rec = Trainer(compose(*met)).fit()
    assert rec["step"] == 3 and [r["step"] for r in records(run)] == [3]   # eval_every 3 of max_steps 6
    out = capsys.readouterr().out
    assert "stopping at step 3 of 6: trainer.stop_when=heldout_loss<=1000 met" in out
    assert load_run(run).status == "complete"    # the report does not call it unfinished
    before = (run / "metrics.jsonl").read_bytes()
    Trainer(compose(*met, "trainer.resume=auto")).fit()
    assert "is complete (step 3: trainer.stop_when=heldout_loss<=1000 met)" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_bytes() == before                   # nothing trained, nothing written
    rec = Trainer(compose(*tiny, f"run_dir={run}", "trainer.resume=auto")).fit()   # cleared: on to max_steps
    assert rec["step"] == 6 and [r["step"] for r in records(run)] == [3, 6]


def test_a_bound_never_met_trains_to_max_steps(compose, tiny, tmp_path):
    run = tmp_path / "run"
    rec = Trainer(compose(*tiny, "trainer.stop_when='heldout_loss<=0'", f"run_dir={run}")).fit()
    assert rec["step"] == 6 and load_run(run).status == "complete"


def test_recall_accuracy_stops_a_recall_run(compose, tmp_path):
    run = tmp_path / "recall"
    rec = Trainer(compose("experiment=recall_state_cpu", "+experiment/arm=exp", "trainer.stages=null",
                          "trainer.max_steps=4", "trainer.eval_every=2", "trainer.stop_when='recall_accuracy>=0'",
                          f"run_dir={run}")).fit()
    assert rec["step"] == 2 and "recall_accuracy" in rec
