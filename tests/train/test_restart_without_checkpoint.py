"""A run folder whose launch stopped before its first checkpoint (kill -9, a crash) holds nothing to continue: a
relaunch starts the run over from step 0 and says so in one line, whatever trainer.resume says but true; the
evaluations the stopped launch logged are kept aside, so metrics.jsonl holds the new run's alone. A folder holding a
checkpoint is still refused without trainer.resume."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longctx.train.data import resolve_splits
from longctx.train.trainer import Trainer
from _resumed import assert_same_records, records

REPO = Path(__file__).resolve().parents[2]
SAID = "holds no checkpoint to continue from: starting the run over from step 0"


def stopped_before_its_checkpoint(compose, tiny, run: Path, evaluated: bool) -> bytes:
    """`run` as a launch leaves it when killed before its first checkpoint: its config, log and provenance, and
    (`evaluated`) the step-3 evaluation it appended just before the checkpoint it never wrote, marked so that it
    cannot pass for the new run's. Returns metrics.jsonl's bytes (b"" when absent)."""
    Trainer(compose(*tiny, "trainer.max_steps=3", f"run_dir={run}")).fit()
    shutil.rmtree(run / "checkpoints")
    if not evaluated:
        (run / "metrics.jsonl").unlink()
        return b""
    row = {**records(run)[0], "train_loss": 99.0}
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    return (run / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("resume", ["false", "auto"])
@pytest.mark.parametrize("evaluated", [True, False])
def test_a_folder_without_a_checkpoint_starts_over_saying_so(compose, tiny, tmp_path, capsys, resume, evaluated):
    clean = tmp_path / "clean"
    Trainer(compose(*tiny, f"run_dir={clean}")).fit()
    run = tmp_path / "run"
    old = stopped_before_its_checkpoint(compose, tiny, run, evaluated)
    capsys.readouterr()
    Trainer(compose(*tiny, f"trainer.resume={resume}", f"run_dir={run}")).fit()
    said = [line for line in capsys.readouterr().out.splitlines() if SAID in line]
    assert len(said) == 1 and said[0].startswith(f"{run} {SAID}; what the stopped launch wrote kept aside as ")
    logged = "metrics.before_restart.jsonl (1 evaluation)"
    assert (logged in said[0]) == evaluated
    for name in said[0].split(" kept aside as ")[1].split(", "):
        assert (run / name.split(" (")[0]).exists(), name            # every name said is there
    assert sum(SAID in line for line in (run / "train.log").read_text().splitlines()) == 1
    assert_same_records(records(clean), records(run))  # the new run's evaluations only: steps 3 and 6
    assert [r["train_loss"] for r in records(run)] == [r["train_loss"] for r in records(clean)]
    kept = run / "metrics.before_restart.jsonl"
    # kept byte for byte, but for its per-document record's path, which now names the kept records folder
    repointed = old.replace(b'"doc_bins": "eval/', b'"doc_bins": "eval.before_restart/')
    assert repointed != old or not evaluated
    assert (kept.read_bytes() == repointed) if evaluated else not kept.exists()


def test_starting_over_with_another_model_leaves_a_folder_that_describes_the_new_run(compose, tiny, tmp_path):
    """The stopped launch trained exp attention; the relaunch trains linear: config.yaml, the data record and the
    per-document records are the new run's (evaluate loads its checkpoints), the stopped launch's kept beside."""
    from longctx.runs import load_run

    run = tmp_path / "run"
    stopped_before_its_checkpoint(compose, tiny, run, evaluated=True)
    old_records = sorted(p.name for p in (run / "eval").iterdir())
    old_npz = {p.name: p.read_bytes() for p in (run / "eval").iterdir()}
    Trainer(compose(*tiny, "attention=linear", f"run_dir={run}")).fit()
    from omegaconf import OmegaConf

    named = [OmegaConf.load(run / f).attention.name for f in ("config.yaml", "config.before_restart.yaml")]
    assert named == ["linear", "exp"]
    model, cfg = load_run(run)                                      # config.yaml agrees with its checkpoints
    assert cfg.attention.name == "linear" and model.spec.attention == "linear"
    assert (run / "data_identity.json").exists() and (run / "data_identity.before_restart.json").exists()
    kept = run / "eval.before_restart"
    assert sorted(p.name for p in kept.iterdir()) == old_records
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == old_npz  # the stopped launch's records untouched
    kept_row = json.loads((run / "metrics.before_restart.jsonl").read_text())
    assert (run / kept_row["doc_bins"]).read_bytes() == old_npz[Path(kept_row["doc_bins"]).name]
    assert kept_row["doc_bins"].startswith("eval.before_restart/")   # not the new run's eval/, same names


def test_a_folder_holding_weights_but_no_checkpoint_is_refused(compose, tiny, tmp_path):
    """A run shared as its safetensors weights (or one whose .pt files were removed) is a run: never started over,
    whatever trainer.resume says."""
    run = tmp_path / "run"
    Trainer(compose(*tiny, f"run_dir={run}")).fit()
    for pt in (run / "checkpoints").glob("*.pt"):
        pt.unlink()
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    for resume in ("false", "auto"):
        with pytest.raises(FileExistsError, match=r"holds a run's weights \(step_00000006\.safetensors\) but no "
                                                  r"checkpoint to continue from"):
            Trainer(compose(*tiny, f"trainer.resume={resume}", f"run_dir={run}"))
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_a_folder_holding_a_checkpoint_is_still_refused(compose, tiny, tmp_path):
    run = tmp_path / "run"
    Trainer(compose(*tiny, "trainer.max_steps=3", f"run_dir={run}")).fit()
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(FileExistsError, match=r"already holds a run \(checkpoint: step_00000003\.pt\)"):
        Trainer(compose(*tiny, f"run_dir={run}"))
    assert (run / "metrics.jsonl").read_bytes() == before


def test_trainer_resume_true_still_needs_a_checkpoint(compose, tiny, tmp_path):
    run = tmp_path / "run"
    stopped_before_its_checkpoint(compose, tiny, run, evaluated=True)
    with pytest.raises(FileNotFoundError, match=r"trainer.resume=true but .* holds no checkpoint"):
        Trainer(compose(*tiny, "trainer.resume=true", f"run_dir={run}"))


@pytest.mark.slow
def test_sigkill_before_the_first_checkpoint_then_a_plain_relaunch(train_env, tiny, compose, tmp_path):
    """The real thing: kill -9 while the first steps train, then the same command again."""
    cfg = compose(*tiny)
    resolve_splits(cfg.data, cfg.ctx)
    run = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "train.py"), *tiny, f"hydra.run.dir={run}"]
    proc = subprocess.Popen([*cmd, "trainer.max_steps=100000", "trainer.eval_every=100000",
                             "logger.console_every=1"], env=train_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        log = run / "train.log"
        if log.exists() and "step      2/" in log.read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (run / "checkpoints").exists()
    again = subprocess.run(cmd, env=train_env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sum(SAID in line for line in again.stdout.splitlines()) == 1
    assert [r["step"] for r in records(run)] == [3, 6]


def test_a_second_set_aside_keeps_the_first_and_one_set_shares_its_number(tmp_path):
    from longctx.train.run_files import set_aside

    names = []
    for text in ("first\n", "second\n"):
        (tmp_path / "metrics.jsonl").write_text(text)
        names += [p.name for p in set_aside([tmp_path / "metrics.jsonl"], "before_restart")]
    assert names == ["metrics.before_restart.jsonl", "metrics.before_restart2.jsonl"]
    assert [(tmp_path / n).read_text() for n in names] == ["first\n", "second\n"]
    assert not (tmp_path / "metrics.jsonl").exists()
    # a launch that wrote a config but no metrics, then one that wrote both: each set-aside one number for all, never
    # one an earlier set-aside's files hold (config.before_restart.yaml would pair with the first metrics)
    (tmp_path / "config.yaml").write_text("third\n")
    moved = set_aside([tmp_path / "metrics.jsonl", tmp_path / "config.yaml"], "before_restart")
    assert [p.name for p in moved] == ["config.before_restart3.yaml"]
    (tmp_path / "config.yaml").write_text("fourth\n")
    (tmp_path / "metrics.jsonl").write_text("fourth\n")
    moved = set_aside([tmp_path / "metrics.jsonl", tmp_path / "config.yaml"], "before_restart")
    assert [p.name for p in moved] == ["metrics.before_restart4.jsonl", "config.before_restart4.yaml"]
    assert all(p.read_text() == "fourth\n" for p in moved)


def test_a_folder_whose_checkpoints_were_removed_is_not_started_over(compose, tiny, tmp_path):
    """Every evaluation is followed by a checkpoint, so two evaluations without one are a run whose checkpoints were
    removed (to free disk), not a launch stopped early: refused, nothing renamed."""
    run = tmp_path / "run"
    Trainer(compose(*tiny, f"run_dir={run}")).fit()
    shutil.rmtree(run / "checkpoints")
    before = sorted(p.name for p in run.iterdir())
    for resume in ("false", "auto"):
        with pytest.raises(FileExistsError, match=r"holds 2 evaluations but no checkpoint \(removed\?\)"):
            Trainer(compose(*tiny, f"trainer.resume={resume}", f"run_dir={run}"))
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_stopped_launchs_malformed_metrics_and_bad_wandb_id_go_aside_with_it(compose, tiny, tmp_path, monkeypatch):
    """What a start-over sets aside is never read first: a malformed metrics line or a wandb id wandb would refuse
    (each refused when it belongs to a run being continued) is kept aside as it is, and the run starts over."""
    import longctx.train.trainer as trainer_module

    run = tmp_path / "run"
    stopped_before_its_checkpoint(compose, tiny, run, evaluated=False)
    metrics = b'{"step": 3, "train_loss": 1.0}\n{"step": 3\n["not a record"]\n'   # 1 evaluation, 2 bad lines
    (run / "metrics.jsonl").write_bytes(metrics)
    (run / "wandb_id").write_text("not an id/at all\n")
    ids = []
    monkeypatch.setattr(trainer_module, "WandbLogger", lambda *args: ids.append(args[-1]))
    Trainer(compose(*tiny, "logger.wandb.mode=offline", f"run_dir={run}"))
    assert (run / "metrics.before_restart.jsonl").read_bytes() == metrics
    assert (run / "wandb_id.before_restart").read_text() == "not an id/at all\n"
    assert not (run / "metrics.jsonl").exists() and len(ids) == 1
    assert (run / "wandb_id").read_text() == ids[0] + "\n" and ids[0] != "not an id/at all"



def test_kept_metrics_name_the_kept_records_and_keep_every_other_byte(tmp_path):
    """_repoint_records on what a stopped launch may leave: CRLF line ends, a line that is not UTF-8, another field
    holding the same path, and a records folder that was never written (the path still leaves the new run's eval/)."""
    from longctx.train.trainer import _repoint_records

    metrics = tmp_path / "metrics.before_restart2.jsonl"
    raw = (b'{"step": 2, "note": "eval/step_00000002.npz", "doc_bins": "eval/step_00000002.npz"}\r\n'
           b'{"step": 3, "text": "\xff"}\n'
           b'{"step": 4, "doc_bins": "eval/step_00000004.npz"}')
    metrics.write_bytes(raw)
    _repoint_records([metrics])
    assert metrics.read_bytes() == (
        b'{"step": 2, "note": "eval/step_00000002.npz", "doc_bins": "eval.before_restart2/step_00000002.npz"}\r\n'
        b'{"step": 3, "text": "\xff"}\n'
        b'{"step": 4, "doc_bins": "eval.before_restart2/step_00000004.npz"}')
