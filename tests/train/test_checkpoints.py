"""Checkpoints are data, never code, and every loader reads them one way (train/checkpoint.py):

- a crafted checkpoint (a pickle `__reduce__` payload) is refused with one line by load_run, evaluate, generate,
  trainer.init_from and resume, and its payload never runs;
- the newest checkpoint cut short, a directory, or not a checkpoint is skipped with one warning naming it
  (resume refuses a directory before training: its name is a checkpoint it would write); one of a newer schema is
  refused, never skipped (tests/hostile/test_runs_hostile.py);
- a full disk at a save gives one line naming the file and the cause, and leaves no temp file;
- checkpoints written before the schema had a version (version 0) still resume, evaluate, generate and load;
- an old config.yaml without keys added since loads with their defaults, or names the missing key.
One tiny run is trained for the module (CPU, a few seconds)."""
from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from longctx import load_run
from longctx.evaluate import main as evaluate_main
from longctx.generate import main as generate_main
from longctx.runs import RunError
from longctx.train import checkpoint as ckpt
from longctx.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["optim.warmup_steps=1",
         "trainer.max_steps=4", "trainer.eval_every=2", "logger.wandb.mode=disabled", "data.train_tokens=65536",
         "data.n_heldout=16", "data.eval_docs=8", "data.docs_per_batch=4", "data.doc_len=256", "ctx=64",
         "trainer.num_threads=2", "model.n_layers=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run):
    """A finished run: checkpoints at steps 2 and 4."""
    return train_run(tmp_path_factory.mktemp("runs") / "source", TRAIN)


class Payload:
    """Unpickling this calls open(marker, "w"): a file appears if the loader ran the pickle's code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def copy_run(run: Path, dest: Path, steps=(2, 4)) -> Path:
    """The run's folder with only the checkpoints of `steps`."""
    shutil.copytree(run, dest)
    for step, path in ckpt.list_checkpoints(dest):
        if step not in steps:
            path.unlink()
    return dest


def crafted_run(run: Path, dest: Path, marker: Path) -> Path:
    """A run folder whose only checkpoint carries a payload beside genuine weights."""
    copy_run(run, dest, steps=(4,))
    path = ckpt.checkpoint_dir(dest) / "step_00000004.pt"
    state = ckpt.load_checkpoint(path)
    state["data"] = Payload(marker)
    torch.save(state, path)
    return dest


def one_line(capsys, code, expected_code, words):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == expected_code, err
    assert err and err[-1].startswith("error: ") and words in err[-1], err
    assert not any("Traceback" in line for line in err), err


def old_format(state: dict) -> dict:
    """The dict the trainer wrote before checkpoints had a schema version: counters at the top level,
    numpy's RNG state as np.random.get_state()'s tuple (an ndarray inside)."""
    trainer = state["trainer"]
    ranks = []
    for rank in state["rng"]["per_rank"]:
        n = rank["numpy"]
        ranks.append({"python": rank["python"], "torch": rank["torch"],
                      "numpy": (n["algorithm"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                                n["cached_gaussian"])})
    return {"model": state["model"], "optimizer": state["optimizer"], "scheduler": state["scheduler"],
            "data": state["data"], "step": trainer["step"], "tokens": trainer["tokens"],
            "elapsed": trainer["elapsed"], "rng": {"per_rank": ranks}, "skipped_steps": trainer["skipped_steps"],
            "config": state["config"], "wandb_id": trainer["wandb_id"], "spec": state["spec"]}


def to_old_format(run_dir: Path) -> None:
    for _, path in ckpt.list_checkpoints(run_dir):
        torch.save(old_format(ckpt.read(path, ckpt.PARTS)), path)


def last_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


# -- a crafted checkpoint runs nothing ------------------------------------------------------------------------

def test_crafted_checkpoint_is_refused_by_load_run(run, tmp_path):
    marker = tmp_path / "pwned"
    bad = crafted_run(run, tmp_path / "crafted", marker)
    with pytest.raises(RunError, match=r"step_00000004\.pt is unreadable \(it holds .*open.*could run code\)"):
        load_run(bad, device="cpu")
    with pytest.raises(RunError, match="could run code"):
        load_run(bad, step=4, device="cpu")
    assert not marker.exists()


@pytest.mark.parametrize("cli", ["evaluate", "generate"])
def test_crafted_checkpoint_is_one_line_in_the_clis(run, tmp_path, capsys, cli):
    marker = tmp_path / "pwned"
    bad = crafted_run(run, tmp_path / "crafted", marker)
    if cli == "evaluate":
        code = evaluate_main([str(bad), "--ctx", "64", "--out", str(tmp_path / "e.json"), "--device", "cpu"])
    else:
        code = generate_main([str(bad), "--max-new-tokens", "3", "--prompt-ids", "1,2", "--device", "cpu"])
    assert not marker.exists() and not (tmp_path / "e.json").exists()
    one_line(capsys, code, 2, "could run code")


def test_crafted_checkpoint_is_refused_by_init_from(run, compose, tmp_path):
    marker = tmp_path / "pwned"
    bad = crafted_run(run, tmp_path / "crafted", marker)
    for source in (bad, ckpt.checkpoint_dir(bad) / "step_00000004.pt"):  # a run folder or a file
        with pytest.raises(ValueError, match=r"trainer\.init_from=.*unreadable .*could run code"):
            Trainer(compose(*TRAIN, f"trainer.init_from={source}", f"run_dir={tmp_path / 'new'}"))
    assert not marker.exists() and not (tmp_path / "new").exists()


def test_crafted_checkpoint_is_refused_on_resume(run, compose, tmp_path):
    marker = tmp_path / "pwned"
    bad = crafted_run(run, tmp_path / "crafted", marker)
    before = (bad / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"trainer\.resume: none of the 1 checkpoint\(s\) .* could run code"):
        Trainer(compose(*TRAIN, "trainer.max_steps=6", "trainer.resume=true", f"run_dir={bad}"))
    assert not marker.exists() and (bad / "metrics.jsonl").read_text() == before


@pytest.mark.slow  # a train.py process (start-up: tens of seconds on a busy machine)
def test_crafted_checkpoint_is_refused_on_resume_by_train_py(run, train_env, tmp_path):
    marker = tmp_path / "pwned"
    bad = crafted_run(run, tmp_path / "crafted", marker)
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *TRAIN, "trainer.max_steps=6",
                           "trainer.resume=true", f"hydra.run.dir={bad}"],
                          env=train_env, capture_output=True, text=True, timeout=300)
    assert not marker.exists()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trainer.resume: none of the 1 checkpoint(s)"), lines
    assert "could run code" in lines[0]


# -- falling back past unusable checkpoints ---------------------------------------------------------------------

def spoil(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "not a checkpoint":
        torch.save({"weights": torch.zeros(2)}, path)


@pytest.mark.parametrize("how", ["truncated", "directory", "not a checkpoint"])
def test_loaders_fall_back_to_the_newest_readable_checkpoint(run, compose, tmp_path, caplog, capsys, how):
    cut = copy_run(run, tmp_path / "cut")
    newest = ckpt.checkpoint_dir(cut) / "step_00000004.pt"
    spoil(newest, how)
    older = ckpt.read(ckpt.checkpoint_dir(cut) / "step_00000002.pt")

    with caplog.at_level("WARNING", logger="longctx"):
        model, _ = load_run(cut, device="cpu")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"checkpoint {newest} is unreadable" in warnings[0]
    assert "falling back to step_00000002.pt" in warnings[0]
    assert model.checkpoint_step == 2
    assert all(torch.equal(v, older["model"][k]) for k, v in model.state_dict().items())
    with pytest.raises(RunError, match=r"step_00000004\.pt is unreadable"):
        load_run(cut, step=4, device="cpu")  # an asked step is never replaced by another

    out = tmp_path / "e.json"
    assert evaluate_main([str(cut), "--ctx", "64", "--docs", "2", "--out", str(out), "--device", "cpu"]) == 0
    assert json.loads(out.read_text())["step"] == 2
    assert generate_main([str(cut), "--max-new-tokens", "3", "--prompt-ids", "1,2", "--device", "cpu"]) == 0

    capsys.readouterr()
    fresh = Trainer(compose(*TRAIN, f"trainer.init_from={cut}", f"run_dir={tmp_path / 'init'}"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: checkpoint {newest} is unreadable"), err
    assert all(torch.equal(v, older["model"][k]) for k, v in fresh.model.state_dict().items())


def test_a_resumed_run_estimates_the_steps_left(run, compose, tmp_path, capsys):
    """Resumed at step 4 of trainer.max_steps=10: the estimate line counts the 6 steps left."""
    cut = copy_run(run, tmp_path / "resumed")
    capsys.readouterr()
    trainer = Trainer(compose(*TRAIN, "trainer.max_steps=10", "trainer.resume=true", f"run_dir={cut}"))
    trainer.close()
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("estimate: ")]
    assert len(said) == 1 and "for the 6 steps left after step 4 at an assumed rate" in said[0], said
    assert (trainer.estimate.steps, trainer.step) == (6, 4)


@pytest.mark.parametrize("how", ["truncated", "not a checkpoint"])
def test_resume_falls_back_and_redoes_the_steps_exactly(run, compose, tmp_path, capsys, how):
    cut = copy_run(run, tmp_path / "cut")
    newest = ckpt.checkpoint_dir(cut) / "step_00000004.pt"
    spoil(newest, how)
    capsys.readouterr()
    trainer = Trainer(compose(*TRAIN, "trainer.resume=true", f"run_dir={cut}"))
    assert (trainer.step, trainer.estimate.steps) == (2, 2)   # the estimate counts from the checkpoint resumed
    rec = trainer.fit()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith(f"warning: checkpoint {newest} is unreadable"), err
    assert err[1].startswith("warning: step_00000004.pt: unreadable, kept aside as step_00000004.pt.unreadable")
    assert newest.with_name("step_00000004.pt.unreadable").is_file()  # kept, out of the pruning's way
    assert newest.with_name("step_00000004.safetensors.unreadable").is_file()  # its weights too: never the newest
    a = last_record(run)
    for key in ("step", "tokens", "train_loss", "best_context_loss", "icl_curve"):
        assert rec[key] == a[key], key
    assert ckpt.read(newest, ckpt.PARTS)["trainer"]["step"] == 4  # rewritten whole


def test_resume_refuses_a_directory_in_its_way_before_training(run, compose, tmp_path):
    cut = copy_run(run, tmp_path / "cut")
    newest = ckpt.checkpoint_dir(cut) / "step_00000004.pt"
    spoil(newest, "directory")
    before = (cut / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=rf"trainer\.resume: {newest} is not a checkpoint file but would receive the "
                                         r"checkpoint of step 4; move it away"):
        Trainer(compose(*TRAIN, "trainer.max_steps=6", "trainer.resume=true", f"run_dir={cut}"))
    assert (cut / "metrics.jsonl").read_text() == before and newest.is_dir()


def test_no_readable_checkpoint_is_one_clear_error(run, compose, tmp_path, capsys):
    cut = copy_run(run, tmp_path / "cut")
    for _, path in ckpt.list_checkpoints(cut):
        spoil(path, "truncated")
    with pytest.raises(RunError, match=r"none of the 2 checkpoint\(s\) in .*checkpoints is readable"):
        load_run(cut, device="cpu")
    code = evaluate_main([str(cut), "--ctx", "64", "--out", str(tmp_path / "e.json"), "--device", "cpu"])
    one_line(capsys, code, 2, "none of the 2 checkpoint(s)")
    with pytest.raises(ValueError, match=r"trainer\.resume: none of the 2 checkpoint\(s\) .* move them away"):
        Trainer(compose(*TRAIN, "trainer.resume=true", f"run_dir={cut}"))


# -- writing: a full disk, temp files ---------------------------------------------------------------------------

def full_disk(monkeypatch):
    """torch.save writes part of the file, then the disk is full."""
    def save(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(ckpt.torch, "save", save)


def test_a_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, {"w": torch.ones(2)}, keep=2)
    full_disk(monkeypatch)
    with pytest.raises(ckpt.CheckpointWriteError) as caught:
        ckpt.save_checkpoint(tmp_path, 2, {"w": torch.ones(2)}, keep=2)
    message = str(caught.value)
    final = ckpt.checkpoint_dir(tmp_path) / "step_00000002.pt"
    assert message == (f"could not write checkpoint {final}: No space left on device; nothing was written there "
                       f"(older checkpoints are kept)")
    assert sorted(p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir()) == ["step_00000001.pt"]


def test_a_full_disk_stops_training_with_one_line(compose, tmp_path, monkeypatch):
    trainer = Trainer(compose(*TRAIN, f"run_dir={tmp_path / 'run'}"))
    full_disk(monkeypatch)
    with pytest.raises(ckpt.CheckpointWriteError, match=r"step_00000002\.pt: No space left on device"):
        trainer.fit()
    assert list(ckpt.checkpoint_dir(tmp_path / "run").iterdir()) == []


@pytest.mark.slow  # a train.py process
def test_a_checkpoint_folder_that_cannot_be_made_is_one_line_before_training(train_env, tmp_path):
    """A file holds the checkpoint folder's name: train.py refuses in one line before the first step (it once
    trained up to its first save, then stopped); a write that fails mid-run is test_a_full_disk_stops_training."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("in the way")
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *TRAIN, f"hydra.run.dir={run}"],
                          env=train_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: run_dir={str(run)!r}: {run / 'checkpoints'} is not a folder, where the run writes its checkpoints; "
        f"move it away. Nothing was written."]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]


def test_stale_temp_files_are_removed_at_the_next_start(run, compose, tmp_path):
    cut = copy_run(run, tmp_path / "cut")
    stale = ckpt.checkpoint_dir(cut) / ".step_00000006.pt.tmp4242"
    stale.write_bytes(b"left by a killed write")
    Trainer(compose(*TRAIN, "trainer.max_steps=6", "trainer.resume=true", f"run_dir={cut}"))
    assert not stale.exists()


# -- version-0 checkpoints ---------------------------------------------------------------------------------------

def test_unversioned_checkpoint_is_read_as_version_0(run, tmp_path):
    old = copy_run(run, tmp_path / "old")
    to_old_format(old)
    raw = ckpt.load_checkpoint(ckpt.checkpoint_dir(old) / "step_00000004.pt")
    assert set(raw) == {"model", "optimizer", "scheduler", "data", "step", "tokens", "elapsed", "rng",
                        "skipped_steps", "config", "wandb_id", "spec"}
    assert isinstance(raw["rng"]["per_rank"][0]["numpy"][1], np.ndarray)
    new = ckpt.read(ckpt.checkpoint_dir(run) / "step_00000004.pt", ckpt.PARTS)
    upgraded = ckpt.read(ckpt.checkpoint_dir(old) / "step_00000004.pt", ckpt.PARTS)
    assert upgraded["schema_version"] == new["schema_version"] == ckpt.SCHEMA_VERSION
    # counters added since version 0 are absent from it and take their defaults when loaded (ckpt.Attributes)
    from longctx.train.trainer import COUNTERS
    later = {k: v for k, v in new["trainer"].items() if k not in upgraded["trainer"]}
    assert later == {k: COUNTERS[k] for k in later} and set(later) <= {"prior_tokens", "prior_flops"}
    assert upgraded["trainer"] == {k: v for k, v in new["trainer"].items() if k not in later}
    assert upgraded["data"] == new["data"]
    a, b = upgraded["rng"]["per_rank"][0], new["rng"]["per_rank"][0]
    assert a["python"] == b["python"] and torch.equal(a["torch"], b["torch"])
    assert torch.equal(a["numpy"]["keys"], b["numpy"]["keys"]) and a["numpy"]["pos"] == b["numpy"]["pos"]


def test_old_run_folders_resume_exactly(run, compose, tmp_path):
    old = copy_run(run, tmp_path / "old", steps=(2,))
    to_old_format(old)
    rec = Trainer(compose(*TRAIN, "trainer.resume=true", f"run_dir={old}")).fit()
    a = last_record(run)
    for key in ("step", "tokens", "train_loss", "best_context_loss", "icl_curve", "per_position_loss"):
        assert rec[key] == a[key], key
    assert ckpt.load_checkpoint(ckpt.checkpoint_dir(old) / "step_00000004.pt")["schema_version"] == 1


def test_old_run_folders_evaluate_generate_and_load(run, compose, tmp_path, capsys):
    old = copy_run(run, tmp_path / "old")
    to_old_format(old)
    model, _ = load_run(old, device="cpu")
    ref, _ = load_run(run, device="cpu")
    assert model.checkpoint_step == 4
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.state_dict().items())
    out = tmp_path / "e.json"
    assert evaluate_main([str(old), "--ctx", "64", "--docs", "2", "--out", str(out), "--device", "cpu"]) == 0
    assert generate_main([str(old), "--max-new-tokens", "3", "--prompt-ids", "1,2", "--temperature", "0",
                          "--device", "cpu"]) == 0
    fresh = Trainer(compose(*TRAIN, f"trainer.init_from={old}", f"run_dir={tmp_path / 'init'}"))
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in fresh.model.state_dict().items())


# -- old config.yaml files --------------------------------------------------------------------------------------

def config_only_run(run: Path, dest: Path, drop: str) -> Path:
    """A run whose checkpoint holds no config (the oldest layout): config.yaml, without `drop`, is the config."""
    copy_run(run, dest, steps=(4,))
    path = ckpt.checkpoint_dir(dest) / "step_00000004.pt"
    state = old_format(ckpt.read(path, ckpt.PARTS))
    del state["config"]
    torch.save(state, path)
    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    section, key = drop.split(".")
    del cfg[section][key]
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg))
    return dest


@pytest.mark.parametrize("key", ["arch.rope_base", "arch.rope_dims", "arch.token_shift", "model.mlp_ratio"])
def test_old_config_without_a_newer_key_loads_with_its_default(run, tmp_path, key):
    model, _ = load_run(config_only_run(run, tmp_path / "old", key), device="cpu")
    ref, _ = load_run(run, device="cpu")
    assert model.spec == ref.spec


def test_config_without_a_required_key_names_it(run, tmp_path):
    with pytest.raises(RunError, match=r"its config does not build a model: config: model\.d_model is missing"):
        load_run(config_only_run(run, tmp_path / "old", "model.d_model"), device="cpu")


def test_a_checkpoint_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path):
    """A FIFO (or a link to one) named like a checkpoint would block the reader forever: refused, naming it."""
    import os
    fifo = tmp_path / "step_00000009.pt"
    os.mkfifo(fifo)
    (tmp_path / "step_00000010.pt").symlink_to(fifo)
    for path in (fifo, tmp_path / "step_00000010.pt"):
        with pytest.raises(ckpt.CheckpointError, match="is unreadable \\(not a regular file\\)"):
            ckpt.read(path)
    with pytest.raises(ckpt.CheckpointError, match="not a regular file"):
        ckpt.read_weights(tmp_path / "step_00000009.pt")
