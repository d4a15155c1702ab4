"""Bad input is caught before any work, in one line naming the key or file, and nothing is written:
unknown keys (even added with +), wrong types, out-of-range and missing values, heldout ids outside the
vocabulary, a changed model on resume. And what is recoverable is recovered: a truncated newest checkpoint
falls back to the older one kept, a small prepared dataset evaluates on the heldout documents it has."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from longctx.data.prepare import PrepareConfig, prepare_dataset
from longctx.train.config import resolve_resume, validate
from longctx.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
ICL_ONLY = ("data.train_tokens", "data.n_heldout")


def generic(overrides):
    return [o for o in overrides if not o.startswith(ICL_ONLY)]


def snapshot(folder: Path) -> dict:
    """Every file under folder -> (size, mtime_ns): equal snapshots mean nothing was written."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("override,message", [
    ("logger.console_every=0", "config: logger.console_every=0: must be a positive integer"),
    ("optim.eps=-1", "config: optim.eps=-1: must be > 0"),
    ("run_name=../../x", "config: run_name='../../x': has a '.', '..' or '\\' path component; the run folder must stay "
                         "inside runs/ (use a plain name such as my_run, or hydra.run.dir=<folder> for another place)"),
    ("+trainer.max_stepz=3", "config: trainer.max_stepz=3: unknown key (no config file defines it; did you mean "
                             "trainer.max_steps?)"),
    ("optim.lr=abc", "config: optim.lr='abc': must be a number"),
    ("atention=power", "config: atention=power: unknown key (no config file defines it; did you mean attention?)"),
    ("p=3", "config: p=3: attention=exp does not read p (only attention=power does); add attention=power, or leave p "
            "out"),
    ("seed=-1", "config: seed=-1: must be an integer in [0, 2**32)"),
    ("data=longcrawl64", "config: data.path is mandatory and not set: add data.path=<value> (the folder holding "
                         "train.zarr and heldout.zarr)"),
])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(train_env, tmp_path, override, message):
    run = tmp_path / "runs" / "run"
    out = subprocess.run([sys.executable, str(REPO / "train.py"), override, f"hydra.run.dir={run}"],
                         env=train_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f"error: {message}"]
    assert not run.exists()  # not even the empty folder (nor a train.log in it)


@pytest.mark.parametrize("override,key", [
    ("+trainer.max_stepz=3", "trainer.max_stepz"), ("+data.colour=red", "data.colour"),
    ("optim.lr=abc", "optim.lr"), ("optim.betas=0.9", "optim.betas"), ("trainer.max_steps=abc", "trainer.max_steps"),
    ("trainer.compile=maybe", "trainer.compile"), ("seed=-1", "seed"), ("seed=1.5", "seed"),
    ("trainer.flops_budget=lots", "trainer.flops_budget"), ("optim.grad_clip=abc", "optim.grad_clip"),
    ("trainer.compile=3", "trainer.compile"), ("trainer.activation_checkpointing=sometimes",
                                               "trainer.activation_checkpointing"),
    # every numeric field of conf/trainer, conf/optim, conf/logger and conf/config.yaml, at its bad edge
    ("logger.console_every=0", "logger.console_every"), ("logger.console_every=-5", "logger.console_every"),
    ("trainer.max_skipped_steps=-1", "trainer.max_skipped_steps"), ("window=0", "window"),
    ("optim.warmup_steps=-1", "optim.warmup_steps"),
    ("optim.weight_decay=-0.1", "optim.weight_decay"), ("optim.eps=0", "optim.eps"), ("optim.eps=-1", "optim.eps"),
    ("optim.lr=0", "optim.lr"), ("optim.lr=inf", "optim.lr"), ("optim.lr=nan", "optim.lr"),
    ("optim.min_lr=-1e-5", "optim.min_lr"), ("optim.min_lr=1", "optim.min_lr"), ("optim.grad_clip=0", "optim.grad_clip"),
    ("optim.grad_clip=inf", "optim.grad_clip"), ("optim.betas=[0.9,1.0]", "optim.betas"),
    ("trainer.flops_budget=inf", "trainer.flops_budget"), ("trainer.flops_budget=0", "trainer.flops_budget"),
    ("trainer.max_steps=0", "trainer.max_steps"), ("trainer.keep_checkpoints=0", "trainer.keep_checkpoints"),
    ("trainer.icl_bins=0", "trainer.icl_bins"), ("trainer.num_threads=0", "trainer.num_threads"),
    ("trainer.micro_docs=0", "trainer.micro_docs"), ("seed=4294967296", "seed"), ("ctx=1", "ctx"),
    ("run_name=../../x", "run_name"), ("run_name=/tmp/x", "run_name"), ("run_name=a/../../b", "run_name"),
    ("run_name=..", "run_name"), ("run_name='~/x'", "run_name"),
])
def test_validate_names_the_key(compose, override, key):
    with pytest.raises(ValueError, match=f"config: {key.replace('.', '[.]')}="):
        validate(compose(override))


@pytest.mark.parametrize("override,key", [("p=7", "p"), ("p=0", "p"), ("p=2.5", "p")])
def test_power_degree_outside_the_kernels_set_names_p(compose, override, key):
    """Power attention supports integer degrees 1..4 (src/models/attention/power.py): p is named as typed."""
    with pytest.raises(ValueError, match=f"config: {key}="):
        validate(compose("attention=power", override))


@pytest.mark.parametrize("key", ["trainer.compile", "trainer.on_nonfinite"])
def test_a_deleted_key_every_run_reads_is_named(compose, key):
    with pytest.raises(ValueError, match=f"config: {key.replace('.', '[.]')}: missing, and every run needs it "
                                         f"[(]deleted with ~{key.replace('.', '[.]')}[?][)]"):
        validate(compose(f"~{key}"))


def test_valid_edges_pass(compose):
    validate(compose("optim.warmup_steps=1000", "optim.weight_decay=0", "optim.min_lr=0", "run_name=group/run1",
                     "trainer.max_skipped_steps=0"))


def test_chosen_option_limits_the_keys(compose):
    """data.path belongs to data=longcrawl64: added to the ICL data it is unknown, not silently ignored."""
    cfg = compose("+data.path=/somewhere")
    validate(cfg)  # without Hydra's choices, any option's keys are known
    with pytest.raises(ValueError, match=r"config: data\.path='/somewhere': unknown key"):
        validate(cfg, choices={"data": "icl_markov"})
    validate(compose("optim.grad_clip=null", "trainer.resume=auto", "optim.lr=1"))  # valid values pass


def test_resume_defaults_to_auto_in_multirun_and_slurm():
    assert resolve_resume(None, multirun=True, environ={}) == "auto"
    assert resolve_resume(None, multirun=False, environ={"SLURM_JOB_ID": "7"}) == "auto"
    assert resolve_resume(None, multirun=False, environ={}) is False
    assert resolve_resume(False, multirun=True, environ={"SLURM_JOB_ID": "7"}) is False  # an explicit value wins


def lc64_dataset(root: Path, train_max: int, heldout_max: int, vocab: int, n_train=16, n_heldout=8, L=128):
    rng = np.random.default_rng(0)
    for split, n, top in (("train", n_train, train_max), ("heldout", n_heldout, heldout_max)):
        data = rng.integers(0, top, size=(n, L), dtype=np.uint16)
        data[-1, 0] = top  # the largest id, in the last document
        arr = zarr.create_array(str(root / f"{split}.zarr"), shape=data.shape, chunks=(8, 64), dtype="uint16",
                                attributes={"vocab_size": vocab, "bos_id": vocab - 1})
        arr[:] = data
    return root


def test_heldout_ids_beyond_the_vocabulary_fail_up_front(compose, tiny, tmp_path):
    root = lc64_dataset(tmp_path / "ds", train_max=98, heldout_max=150, vocab=100)
    run = tmp_path / "run"
    cfg = compose(*generic(tiny), "data=longcrawl64", f"data.path={root}", "data.eval_docs=8", f"run_dir={run}")
    with pytest.raises(ValueError, match=r"data: heldout token id 150 in .*heldout\.zarr .*data\.eval_docs=8.* "
                                         r">= model vocab_size=100"):
        Trainer(cfg)
    assert not run.exists()


def test_small_prepared_dataset_trains_with_default_eval_docs(compose, tiny, tmp_path, capsys, make_corpus):
    """A dataset prepared from a small corpus has fewer heldout documents than data.eval_docs (64): the run
    evaluates on all of them, saying so once, instead of stopping."""
    corpus = make_corpus(tmp_path / "corpus", files=12, words=80, vocab=("long", "context", "power", "attention"))
    out = tmp_path / "ds"
    prepare_dataset(PrepareConfig(source=str(corpus), out=str(out), doc_len=128, heldout_docs=2,
                                  tokenizer="bytes", progress=False))
    cfg = compose(*[o for o in generic(tiny) if not o.startswith("data.eval_docs")], "data=longcrawl64",
                  f"data.path={out}", "trainer.max_steps=2", "trainer.eval_every=2", f"run_dir={tmp_path / 'run'}")
    assert cfg.data.eval_docs == 64  # the default
    rec = Trainer(cfg).fit()
    assert rec["step"] == 2 and np.isfinite(rec["best_context_loss"])
    err = capsys.readouterr().err
    assert "warning: data.eval_docs=64 but" in err and "holds 2 documents: evaluating on all 2" in err
    # evaluate's --docs: the hint names its own flag, not the config key
    from longctx.evaluate import main as evaluate_main
    assert evaluate_main([str(tmp_path / "run"), "--docs", "9", "--device", "cpu",
                          "--out", str(tmp_path / "ev.json")]) == 0
    err = capsys.readouterr().err
    assert "warning: --docs 9 but" in err and "(set --docs 2 to silence this)" in err


def test_truncated_newest_checkpoint_falls_back_to_the_older_one(compose, tiny, tmp_path, capsys):
    full = tmp_path / "full"
    Trainer(compose(*tiny, f"run_dir={full}")).fit()  # checkpoints at steps 3 and 6 (keep_checkpoints=2)
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    newest = cut / "checkpoints" / "step_00000006.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a copy or a disk cut short
    capsys.readouterr()
    rec = Trainer(compose(*tiny, "trainer.resume=true", f"run_dir={cut}")).fit()
    err = capsys.readouterr().err
    assert f"warning: checkpoint {newest} is unreadable" in err and "falling back to step_00000003.pt" in err
    assert "step_00000006.pt: unreadable, kept aside as step_00000006.pt.unreadable" in err
    assert len(err.strip().splitlines()) == 2
    # the cut file is kept aside, not in place: the pruning (keep 2) kept the readable step 3 beside the new step 6
    from longctx.train import checkpoint as ckpt
    assert [s for s, _ in ckpt.list_checkpoints(cut)] == [3, 6]
    for _, path in ckpt.list_checkpoints(cut):
        ckpt.read(path)
    aside = newest.with_name("step_00000006.pt.unreadable")
    assert aside.stat().st_size == (full / "checkpoints" / "step_00000006.pt").stat().st_size // 2
    a = json.loads((full / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["step"] == 6
    for key in ("train_loss", "best_context_loss", "icl_curve", "per_position_loss", "tokens"):
        assert rec[key] == a[key], key  # steps 4-6 redone exactly
    assert "WARNING checkpoint" in (cut / "train.log").read_text()


def test_resume_with_a_changed_model_names_the_keys(compose, tiny, tmp_path):
    run = tmp_path / "run"
    Trainer(compose(*tiny, f"run_dir={run}")).fit()
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"trainer\.resume: .*step_00000006\.pt was written by a different model "
                                         r"\(model\.n_layers: 3 -> 2\)"):
        Trainer(compose(*tiny, "model.n_layers=2", "trainer.resume=true", f"run_dir={run}"))
    with pytest.raises(ValueError, match=r"model\.d_model: 64 -> 32; model\.n_heads: 2 -> 1"):
        Trainer(compose(*tiny, "model.d_model=32", "model.n_heads=1", "trainer.resume=true", f"run_dir={run}"))
    assert snapshot(run) == before


def test_a_bad_data_value_is_named_before_the_folders_run(compose, tiny, tmp_path):
    """Pointed at a folder that already holds a run, a bad generated-data value is still what the error names (not
    "already holds a run", which would hide it), and nothing in the folder changes."""
    run = tmp_path / "run"
    Trainer(compose(*tiny, f"run_dir={run}")).fit()
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"^data\.alpha: must be a positive number, got -1"):
        Trainer(compose(*tiny, "data.alpha=-1", f"run_dir={run}"))
    with pytest.raises(ValueError, match=r"^data\.n_pairs=300: more pairs than keys"):
        Trainer(compose(*generic(tiny), "data=mqar", "data.n_pairs=300", "data.n_keys=256", f"run_dir={run}"))
    with pytest.raises(FileExistsError, match="already holds a run"):
        Trainer(compose(*tiny, f"run_dir={run}"))
    assert snapshot(run) == before


def test_init_from_starts_a_new_run_from_another_runs_weights(compose, tiny, tmp_path):
    """trainer.init_from: the new run's model equals the source's newest checkpoint at step 0 (also at another
    ctx), while its step count, optimizer and schedule start fresh; a changed model or a missing source fails
    with one line naming the key, before anything is written."""
    import torch

    from longctx.train import checkpoint as ckpt

    source = tmp_path / "short"
    Trainer(compose(*tiny, f"run_dir={source}")).fit()
    step, path = ckpt.latest_checkpoint(source)
    weights = ckpt.load_checkpoint(path)["model"]
    longer = Trainer(compose(*tiny, "ctx=256", f"trainer.init_from={source}", f"run_dir={tmp_path / 'long'}"))
    assert longer.step == 0 and longer.scheduler.last_epoch == 0 and not longer.optimizer.state
    for name, value in longer.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    by_file = Trainer(compose(*tiny, f"trainer.init_from={path}", f"run_dir={tmp_path / 'file'}"))
    assert all(torch.equal(v, weights[k]) for k, v in by_file.model.state_dict().items())

    before = snapshot(source)
    with pytest.raises(ValueError, match=r"trainer\.init_from: .*was written by a different model "
                                         r"\(model\.n_layers: 3 -> 2\)"):
        Trainer(compose(*tiny, "model.n_layers=2", f"trainer.init_from={source}", f"run_dir={tmp_path / 'a'}"))
    with pytest.raises(FileNotFoundError, match=r"trainer\.init_from='.*nowhere': no such run directory"):
        Trainer(compose(*tiny, f"trainer.init_from={tmp_path / 'nowhere'}", f"run_dir={tmp_path / 'b'}"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"trainer\.init_from='.*empty': holds no checkpoint"):
        Trainer(compose(*tiny, f"trainer.init_from={empty}", f"run_dir={tmp_path / 'c'}"))
    assert snapshot(source) == before
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))


def test_a_heldout_split_that_is_the_training_split_is_refused(compose, tiny, tmp_path, make_corpus):
    """data.heldout_split naming the training array (or a link to it): the heldout loss would be a training loss."""
    corpus = make_corpus(tmp_path / "corpus", files=8)
    out = tmp_path / "ds"
    prepare_dataset(PrepareConfig(source=str(corpus), out=str(out), doc_len=64, heldout_docs=2, tokenizer="bytes",
                                  progress=False))
    (out / "again.zarr").symlink_to(out / "train.zarr")
    for split in ("train.zarr", "again.zarr"):
        with pytest.raises(ValueError) as caught:
            Trainer(compose(*generic(tiny), "data=longcrawl64", f"data.path={out}", f"data.heldout_split={split}",
                            f"run_dir={tmp_path / 'run'}"))
        assert str(caught.value) == (f"data.heldout_split='{split}': the same array as data.train_split='train.zarr' "
                                     f"({out / 'train.zarr'}); the heldout documents must be others")
    assert not (tmp_path / "run").exists()


def test_a_dataset_written_by_another_prepare_meanwhile_is_never_removed(tmp_path, monkeypatch, make_corpus):
    """Two prepares into one --out without --overwrite: the one that finishes second finds the folder written and
    refuses in one line, the first one's dataset kept whole."""
    import longctx.data.prepare as prepare

    corpus = make_corpus(tmp_path / "corpus", files=8)
    out = tmp_path / "ds"
    release = prepare.release

    def other_prepare_finishes(tmp):   # the race: another run's dataset lands at out while this one works
        release(tmp)
        out.mkdir()
        (out / "prepare.json").write_text('{"seed": 1}')
    monkeypatch.setattr(prepare, "release", other_prepare_finishes)
    with pytest.raises(FileExistsError, match=r"written by another run while this one worked; nothing replaced"):
        prepare_dataset(PrepareConfig(source=str(corpus), out=str(out), doc_len=64, heldout_docs=2,
                                      tokenizer="bytes", progress=False))
    assert (out / "prepare.json").read_text() == '{"seed": 1}'   # the other run's dataset, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "ds"]   # and no temporary folder left


def test_init_from_weights_of_another_tokenizers_text_is_refused(compose, tiny, tmp_path, make_corpus):
    """Weights trained on byte ids, started on a BPE corpus: each id would mean other text, refused in one line naming
    both tokenizers before anything is written; the same tokenizer's data goes on."""
    corpus = make_corpus(tmp_path / "corpus")
    for name, seed in (("bytes", 0), ("bpe", 0), ("bytes2", 1)):
        prepare_dataset(PrepareConfig(source=str(corpus), out=str(tmp_path / name), doc_len=128, heldout_docs=2,
                                      tokenizer="bytes", seed=seed, progress=False))
    for split in ("train.zarr", "heldout.zarr"):   # the same ids said to be another tokenizer's (as a BPE of 257)
        zarr.open(str(tmp_path / "bpe" / split), mode="r+").attrs["tokenizer"] = "bpe-257"
    common = [*generic(tiny), "data=longcrawl64", "data.docs_per_batch=4", "data.eval_docs=2", "trainer.max_steps=1"]
    source = tmp_path / "source"
    Trainer(compose(*common, f"data.path={tmp_path / 'bytes'}", f"run_dir={source}")).fit()
    with pytest.raises(ValueError) as caught:
        Trainer(compose(*common, f"data.path={tmp_path / 'bpe'}", f"trainer.init_from={source}",
                        f"run_dir={tmp_path / 'next'}"))
    said = str(caught.value)
    assert said.startswith(f"trainer.init_from='{source}': its weights were trained on ids of tokenizer bytes ") and \
        "holds ids of tokenizer bpe-257 " in said and "\n" not in said, said
    assert not (tmp_path / "next").exists()
    Trainer(compose(*common, f"data.path={tmp_path / 'bytes2'}", f"trainer.init_from={source}",
                    f"run_dir={tmp_path / 'same'}"))
