"""The trainer's evaluation through longctx.eval: every evaluation writes its per-document record (eval/step_*.npz,
named by the metrics.jsonl record), whose mean over documents is the record's ICL curve, whose per-document loss is
the model's own cross-entropy, and whose `bayes` is the data module's exact optimum of each heldout document; bin
counts too fine to trust are refused before anything is written; a non-finite heldout loss is never logged or
checkpointed silently."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from longctx.data import heldout_batch
from longctx.data.icl_markov import bayes_nll, bayes_nll_mixture
from longctx.eval import bin_docs, read_doc_record
from longctx.eval.records import write_doc_record
from longctx.runs import load_run
from longctx.train import checkpoint as ckpt
from longctx.train.trainer import Trainer

MIXTURE = ["trainer.max_steps=2", "trainer.eval_every=2", "logger.wandb.mode=disabled", "data=icl_markov_long_cpu",
           "data.doc_len=64", "data.train_tokens=16384", "data.n_heldout=16", "data.eval_docs=12",
           "data.docs_per_batch=4", "ctx=64", "trainer.num_threads=2", "trainer.micro_docs=5",
           "optim.warmup_steps=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run, tiny_overrides):
    return train_run(tmp_path_factory.mktemp("runs") / "tiny", list(tiny_overrides))


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "mixture", MIXTURE)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_doc_record(run_dir, rec, optimum):
    """The record's npz against the metrics.jsonl record, the heldout documents and `optimum` (tokens -> exact
    per-token Bayes NLL)."""
    assert rec["doc_bins"] == f"eval/step_{rec['step']:08d}.npz"
    arrays = read_doc_record(run_dir / rec["doc_bins"])
    with np.load(run_dir / rec["doc_bins"], allow_pickle=False) as raw:  # plain arrays: no pickle needed
        assert set(raw.files) == {"loss", "edges", "bayes", "doc_index"}
    loss, edges = arrays["loss"], arrays["edges"]
    n = loss.shape[0]
    assert loss.dtype == np.float32 and arrays["bayes"].dtype == np.float32
    assert edges.dtype == np.int64 and arrays["doc_index"].dtype == np.int64
    assert edges.tolist() == [c[:2] for c in rec["icl_curve"]]
    assert arrays["doc_index"].tolist() == list(range(n))
    np.testing.assert_allclose(loss.astype(np.float64).mean(0), [c[2] for c in rec["icl_curve"]], rtol=0, atol=2e-6)
    np.testing.assert_allclose(arrays["bayes"].astype(np.float64).mean(0), [c[2] for c in rec["bayes_curve"]],
                               rtol=0, atol=2e-6)
    config = load_run(run_dir, device="cpu")[1]
    targets = heldout_batch(rec_heldout(run_dir, config), config.ctx, n)["targets"].numpy()
    np.testing.assert_allclose(arrays["bayes"], bin_docs(optimum(targets, config.data), edges), rtol=0, atol=2e-6)
    return arrays, targets


def rec_heldout(run_dir, config):
    from longctx.train.data import resolve_splits
    return resolve_splits(config.data, config.ctx).heldout_path


def test_every_evaluation_writes_its_per_document_record(run):
    recs = records(run)
    assert [r["step"] for r in recs] == [3, 6]
    for rec in recs:
        arrays, targets = check_doc_record(run, rec, lambda x, data: bayes_nll(x, data.vocab, data.alpha))
        assert arrays["loss"].shape == (32, len(rec["icl_curve"]))
    # each document's binned loss is the final model's own cross-entropy on that document
    model, cfg = load_run(run, device="cpu")
    held = heldout_batch(rec_heldout(run, cfg), cfg.ctx, 32)
    with torch.no_grad():
        nll = F.cross_entropy(model(held["inputs"]).transpose(1, 2), held["targets"], reduction="none")
    np.testing.assert_allclose(arrays["loss"], bin_docs(nll.double().numpy(), arrays["edges"]), rtol=0, atol=2e-5)


def test_mixture_optimum_per_document_and_micro_batches(mixture_run):
    """icl_markov_long_cpu (a mixture of sizes): `bayes` is bayes_nll_mixture of each document; 12 documents in
    forwards of trainer.micro_docs=5 (a ragged last batch) land in their own rows."""
    rec, = records(mixture_run)
    arrays, _ = check_doc_record(mixture_run, rec, lambda x, data: bayes_nll_mixture(
        x, list(data.state_counts), data.alpha, bool(data.get("disjoint_sizes", False))))
    assert arrays["loss"].shape[0] == 12


def test_icl_bins_too_fine_is_refused_before_the_run_starts(compose, tiny, tmp_path):
    with pytest.raises(ValueError, match=r"trainer.icl_bins=1000: at ctx=64 its widest bin holds 1 positions, fewer "
                                         r"than the 8 .*; use trainer.icl_bins=\d+ or fewer"):
        Trainer(compose(*tiny, "trainer.icl_bins=1000", f"run_dir={tmp_path / 'run'}"))
    assert not (tmp_path / "run").exists()


def poison_after_first_step(trainer):
    """Every weight NaN once the first optimizer step is done (what a diverged update leaves behind)."""
    train_step = trainer.train_step

    def step(batch):
        loss = train_step(batch)
        if trainer.step == 0:
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.fill_(float("nan"))
        return loss

    trainer.train_step = step


def test_non_finite_evaluation_stops_without_a_checkpoint(compose, tiny, tmp_path):
    run_dir = tmp_path / "run"
    trainer = Trainer(compose(*tiny, "trainer.eval_every=1", "trainer.on_nonfinite=stop", f"run_dir={run_dir}"))
    poison_after_first_step(trainer)
    with pytest.raises(FloatingPointError, match=r"^non-finite heldout loss at step 1 \(mean nan, 64 of 64 positions\)"
                                                 r"; stopping without a checkpoint \(trainer.on_nonfinite=stop\)$"):
        trainer.fit()
    assert ckpt.list_checkpoints(run_dir) == []
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()
    assert not (run_dir / "eval").exists()


def test_non_finite_evaluation_skipped_is_warned_and_not_checkpointed(compose, tiny, tmp_path, capsys):
    run_dir = tmp_path / "run"
    trainer = Trainer(compose(*tiny, "trainer.eval_every=1", "trainer.max_steps=2", "trainer.on_nonfinite=skip",
                              "trainer.max_skipped_steps=5", f"run_dir={run_dir}"))
    poison_after_first_step(trainer)
    assert trainer.fit() is None
    err = capsys.readouterr().err
    assert "non-finite heldout loss at step 1" in err and "not logged and not checkpointed" in err
    assert "non-finite heldout loss at step 2" in err
    assert ckpt.list_checkpoints(run_dir) == []
    assert not (run_dir / "eval").exists()


def test_a_record_written_over_a_link_replaces_the_link_not_its_target(tmp_path):
    target = tmp_path / "elsewhere.npz"
    target.write_bytes(b"not to be touched")
    link = tmp_path / "eval" / "step_00000001.npz"
    link.parent.mkdir()
    link.symlink_to(target)
    write_doc_record(link, {"loss": np.zeros((2, 1), np.float32)})
    assert target.read_bytes() == b"not to be touched" and not link.is_symlink()
    assert read_doc_record(link)["loss"].shape == (2, 1)
    assert sorted(p.name for p in link.parent.iterdir()) == [link.name]  # no temporary file left
