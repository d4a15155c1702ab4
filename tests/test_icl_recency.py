"""scripts/icl_recency.py on a tiny trained run (CPU): the classes cover every evaluated token, the blind-0 row is the
optimum itself, and the classes' weighted mean is the run's mean excess over the optimum from evaluate's own path."""
from __future__ import annotations

import json

import pytest

from longctx.eval import per_token_loss
from longctx.runs import load_run
from longctx.train.data import build_heldout, resolve_splits

POSITIONS = 24
TRAIN = ["trainer.max_steps=3", "trainer.eval_every=3", "logger.wandb.mode=disabled", "data=icl_markov_long_cpu",
         "data.doc_len=64", "data.train_tokens=16384", "data.n_heldout=16", "data.eval_docs=16",
         "data.docs_per_batch=4", "ctx=64", "trainer.num_threads=2", "attention=exp", "attention.sink=true",
         "arch.rope_dims=16", "arch.token_shift=true", "optim.warmup_steps=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "exp_sink", TRAIN)


def test_recency_table_of_a_run(run, tmp_path, import_script):
    recency = import_script("icl_recency")
    png = recency.main([str(run), "--positions", str(POSITIONS), "--blind", "0,3", "--out", str(tmp_path)])
    assert png == tmp_path / "recency.png" and png.stat().st_size > 10_000
    record = json.loads((tmp_path / "recency.json").read_text())
    model_row, blind0, blind3 = record["rows"]
    assert model_row["label"] == "exp (sink=True), GPT-2 block + token shift, 3 layers, rotary 16/32 dims"
    for row in record["rows"]:  # every evaluated token (positions 1..23 of 16 documents) in exactly one class
        assert sum(c["tokens"] for c in row["classes"].values()) == 16 * (POSITIONS - 1)
    assert all(c["excess"] == 0 for c in blind0["classes"].values())
    assert blind3["classes"]["one, ended 2 back"]["excess"] > 0.1
    # independent path: evaluate's per-position curve minus the optimum, averaged over the same positions
    model, cfg = load_run(run, device="cpu")
    held = build_heldout(resolve_splits(cfg.data, int(cfg.ctx)), cfg.data, POSITIONS, model.spec.vocab_size)
    curve = per_token_loss(model, held["inputs"], held["targets"], micro_docs=4).mean(0)
    expected = (curve - held["bayes_nll"].double().numpy().mean(0))[1:].mean()
    got = sum(c["excess"] * c["tokens"] for c in model_row["classes"].values()) / (16 * (POSITIONS - 1))
    assert got == pytest.approx(expected, abs=1e-3)  # the table rounds each class to 4 decimals
    (tmp_path / "recency.png").unlink()
    assert recency.main(["--replot", str(tmp_path / "recency.json")]) == tmp_path / "recency.png"


@pytest.mark.parametrize("args, words", [(["--positions", "1"], "--positions=1: must be at least 2"),
                                         (["--blind", "a"], "--blind='a': expected comma-separated"),
                                         ([], "give run directories and --out")])
def test_bad_arguments_name_themselves(args, words, import_script, capsys, tmp_path):
    recency = import_script("icl_recency")
    with pytest.raises(SystemExit) as err:
        recency.main((["somerun", "--out", str(tmp_path)] if args else []) + args)
    assert err.value.code == 2 and words in capsys.readouterr().err
