"""A resumed run compares its saved config with the new one: a changed schedule (lr, min_lr, warmup, max_steps,
flops budget) is recomputed from the current step and the recorded lr follows it; a change the checkpoint cannot
take (seed, data, ...) is refused naming it, before anything is written. FLOP-budget runs anneal to their budget.
The lrs are checked against the schedule's closed form, written out here independently of the code."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from longctx.train import checkpoint as ckpt
from longctx.train.trainer import Trainer
from _resumed import records

LR, MIN_LR, WARMUP = 3e-3, 1e-5, 2   # conf/optim/adamw.yaml's lr and min_lr; conftest's TINY warmup


def closed_form(step, lr=LR, min_lr=MIN_LR, warmup=WARMUP, max_steps=6):
    """Linear warmup to lr, cosine to min_lr at max_steps (the paper's schedule)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cut_at_step_3(full: Path, cut: Path) -> None:
    """A copy of a run killed just after its step-3 checkpoint."""
    shutil.copytree(full, cut)
    for path in (cut / "checkpoints").glob("step_*.pt"):
        if path.name != "step_00000003.pt":
            path.unlink()
    (cut / "metrics.jsonl").write_text((cut / "metrics.jsonl").read_text().splitlines()[0] + "\n")


@pytest.fixture(scope="module")
def nine_steps(train_run, tmp_path_factory, tiny_overrides):
    """A 9-step run (evaluations and checkpoints at 3, 6, 9), all checkpoints kept."""
    return train_run(tmp_path_factory.mktemp("resume") / "full",
                     [*tiny_overrides, "trainer.max_steps=9", "trainer.keep_checkpoints=5"])


def test_new_run_records_the_closed_form_lr(nine_steps):
    for r in records(nine_steps):
        assert r["lr"] == pytest.approx(closed_form(r["step"], max_steps=9), rel=1e-12), r["step"]


def test_resume_with_a_changed_lr_trains_with_it(compose, tiny, nine_steps, tmp_path, capsys):
    """optim.lr and optim.min_lr changed on resume at step 3: the steps after it use the new closed form (the
    optimizer's saved lrs and the scheduler's saved base lrs are not kept), said once on the console."""
    cut = tmp_path / "cut"
    cut_at_step_3(nine_steps, cut)
    capsys.readouterr()
    trainer = Trainer(compose(*tiny, "trainer.max_steps=9", "optim.lr=1e-3", "optim.min_lr=1e-6",
                              "trainer.resume=true", f"run_dir={cut}"))
    trainer.fit()
    got = {r["step"]: r["lr"] for r in records(cut)}
    assert got[3] == pytest.approx(closed_form(3, max_steps=9))          # trained before the change
    for step in (6, 9):
        assert got[step] == pytest.approx(closed_form(step, lr=1e-3, min_lr=1e-6, max_steps=9), rel=1e-12), step
    out = capsys.readouterr().out
    assert out.count("resume at step 3: optim.lr: 0.003 -> 0.001; optim.min_lr: 1e-05 -> 1e-06: the schedule is "
                     "recomputed from step 3") == 1


def test_raising_max_steps_mid_run_continues_the_cosine_without_rewarming(compose, tiny, nine_steps, tmp_path,
                                                                          capsys):
    """trainer.max_steps 9 -> 15 at step 3: the lr goes on from where it stood at step 3 along the longer cosine,
    rescaled so that it meets min_lr at step 15: lr(t) = min + (lr(3) - min) (1 + cos(pi (t-w)/(15-w))) /
    (1 + cos(pi (3-w)/(15-w)))."""
    cut = tmp_path / "cut"
    cut_at_step_3(nine_steps, cut)
    capsys.readouterr()
    Trainer(compose(*tiny, "trainer.max_steps=15", "trainer.resume=true", f"run_dir={cut}")).fit()
    out = capsys.readouterr().out
    assert "trainer.max_steps: 9 -> 15: the schedule is recomputed from step 3" in out and "no re-warming" in out
    now = closed_form(3, max_steps=9)
    cos = lambda t: 1 + math.cos(math.pi * (t - WARMUP) / (15 - WARMUP))  # noqa: E731
    lrs = {r["step"]: r["lr"] for r in records(cut)}
    for step in (6, 9, 12, 15):
        assert lrs[step] == pytest.approx(MIN_LR + (now - MIN_LR) * cos(step) / cos(3), rel=1e-12), step
    assert lrs[6] < now and lrs[15] == pytest.approx(MIN_LR)


def test_raising_max_steps_of_a_finished_run_stays_at_the_floor(compose, tiny, nine_steps, tmp_path, capsys):
    """The complete message invites raising trainer.max_steps: the run goes on at min_lr, not re-warmed."""
    done = tmp_path / "done"
    shutil.copytree(nine_steps, done)
    capsys.readouterr()
    Trainer(compose(*tiny, "trainer.max_steps=9", "trainer.resume=auto", f"run_dir={done}")).fit()
    out = capsys.readouterr().out
    assert "Raise trainer.max_steps to train it further (the lr continues from where it stands" in out
    Trainer(compose(*tiny, "trainer.max_steps=12", "trainer.resume=true", f"run_dir={done}")).fit()
    assert "lr stays at min_lr 1e-05 to step 12" in capsys.readouterr().out
    assert [r["lr"] for r in records(done) if r["step"] > 9] == [pytest.approx(MIN_LR, rel=1e-12)]


@pytest.mark.parametrize("override,named", [
    ("seed=1", "seed: 0 -> 1"), ("data.alpha=0.5", "data.alpha: 1.0 -> 0.5"),
    ("data.docs_per_batch=4", "data.docs_per_batch: 8 -> 4"),
])
def test_resume_refuses_a_change_the_checkpoint_cannot_take(compose, tiny, nine_steps, tmp_path, override, named):
    run = tmp_path / "run"
    shutil.copytree(nine_steps, run)
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"trainer\.resume: .* \(step 9\) was trained with other values of keys a "
                                         r"checkpoint cannot change \(" + named.replace(".", r"\.") + r"\)"):
        Trainer(compose(*tiny, "trainer.max_steps=12", override, "trainer.resume=true", f"run_dir={run}"))
    assert snapshot(run) == before


def test_weights_named_only_on_the_resume_are_refused_not_ignored(compose, tiny, nine_steps, tmp_path):
    """trainer.init_from given on a resume would load nothing (the checkpoint's weights are what it continues): refused
    by name, where it once said 'applied'."""
    run = tmp_path / "run"
    shutil.copytree(nine_steps, run)
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"cannot change \(trainer\.init_from: None -> '" + str(nine_steps)):
        Trainer(compose(*tiny, "trainer.max_steps=12", f"trainer.init_from={nine_steps}", "trainer.resume=true",
                        f"run_dir={run}"))
    assert snapshot(run) == before


def test_a_refused_resume_is_its_error_alone(compose, tiny, nine_steps, tmp_path, capsys, monkeypatch):
    """A resume the checkpoint cannot take says nothing before its error: the start-up estimate and the warmup note
    come once the checkpoint is known to take the config (they read as if the run were starting)."""
    run = tmp_path / "run"
    shutil.copytree(nine_steps, run)
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"trainer\.resume: .*seed: 0 -> 1"):
        Trainer(compose(*tiny, "trainer.max_steps=12", "optim.warmup_steps=50", "seed=1", "trainer.resume=true",
                        f"run_dir={run}"))
    out = capsys.readouterr().out
    assert "estimate:" not in out and "warmup_steps" not in out, out
    from longctx.train import estimate
    measured = []
    rate = estimate.cpu_matmul_rate
    monkeypatch.setattr(estimate, "cpu_matmul_rate", lambda: measured.append(1) or rate())
    resumed = Trainer(compose(*tiny, "trainer.max_steps=12", "trainer.resume=true", f"run_dir={run}"))
    said = capsys.readouterr().out
    assert said.count("estimate: peak memory") == 1 and said.index("resuming from") < said.index("estimate:"), said
    assert len(measured) == 1    # the CPU's rate is measured once for the check before the data and the line after
    resumed.close()


def test_optimizer_values_changed_on_resume_are_applied(compose, tiny, nine_steps, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(nine_steps, run)
    trainer = Trainer(compose(*tiny, "trainer.max_steps=12", "optim.weight_decay=0.05", "optim.eps=1e-6",
                              "optim.betas=[0.8,0.95]", "trainer.resume=true", f"run_dir={run}"))
    decay, no_decay = trainer.optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    assert decay["eps"] == no_decay["eps"] == 1e-6 and decay["betas"] == (0.8, 0.95)
    trainer.close()


def test_flops_budget_run_anneals_to_its_budget(compose, tiny, tmp_path, capsys):
    """trainer.flops_budget stops the run at the first step whose FLOPs reach it; the cosine ends there (the budget
    converted to steps by the model's FLOPs per step), and the finished run says the budget was reached."""
    probe = Trainer(compose(*tiny, f"run_dir={tmp_path / 'probe'}"))
    per_step = probe.flops["train_flops_per_token"] * 8 * 64  # docs_per_batch x ctx tokens
    probe.close()
    run = tmp_path / "run"
    overrides = [*tiny, "trainer.max_steps=20", f"trainer.flops_budget={4.5 * per_step}", "trainer.eval_every=2"]
    capsys.readouterr()
    rec = Trainer(compose(*overrides, f"run_dir={run}")).fit()
    assert rec["step"] == 5 and rec["flops"] == pytest.approx(5 * per_step)
    for r in records(run):
        assert r["lr"] == pytest.approx(closed_form(r["step"], max_steps=5), rel=1e-12), r["step"]
    assert rec["lr"] == pytest.approx(MIN_LR)
    out = capsys.readouterr().out
    assert "stopping at step 5: trainer.flops_budget" in out
    assert "for the 5 steps the FLOP budget allows (trainer.flops_budget)" in out  # the estimate, said at start
    Trainer(compose(*overrides, "trainer.resume=auto", f"run_dir={run}")).fit()
    out = capsys.readouterr().out
    assert "is complete (step 5: trainer.flops_budget=" in out and "reached" in out
    assert "Raise trainer.max_steps" not in out

    # a warmup longer than the budget's 2 steps is scaled to 10% of them (1 step), said in one line
    short = Trainer(compose(*tiny, "optim.warmup_steps=4", f"trainer.flops_budget={1.5 * per_step}",
                            f"run_dir={tmp_path / 'short'}"))
    assert (short.schedule.warmup_steps, short.schedule.max_steps) == (1, 2)
    assert ("optim.warmup_steps=4 is longer than the run (2 steps, trainer.flops_budget): warming up over 1 step "
            "instead (10% of it)") in capsys.readouterr().out
    short.close()


def test_a_resume_from_an_older_checkpoint_keeps_the_evaluations_it_redoes(compose, tiny, nine_steps, tmp_path):
    """The evaluations after the checkpoint resumed from (steps 6 and 9 here, the newer checkpoints gone) leave
    metrics.jsonl for redone_after_step3/, with their per-document records: nothing a launch wrote is lost, and the
    redone ones do not meet the old ones under one name."""
    cut = tmp_path / "cut"
    shutil.copytree(nine_steps, cut)
    for path in (cut / "checkpoints").glob("step_*"):
        if not path.name.startswith("step_00000003."):
            path.unlink()
    before = records(cut)
    old_npz = {r["step"]: (cut / r["doc_bins"]).read_bytes() for r in before}
    Trainer(compose(*tiny, "trainer.max_steps=9", "optim.lr=1e-3", "trainer.resume=true", f"run_dir={cut}"))
    kept = cut / "redone_after_step3"
    assert [r["step"] for r in records(cut)] == [3]
    assert [json.loads(line) for line in (kept / "evaluations.jsonl").read_text().splitlines()] == before[1:]
    for r in before[1:]:
        assert (kept / r["doc_bins"]).read_bytes() == old_npz[r["step"]] and not (cut / r["doc_bins"]).exists()
    assert (cut / before[0]["doc_bins"]).read_bytes() == old_npz[3]


def test_dropped_records_never_move_a_file_outside_the_run(tmp_path):
    from longctx.train.loggers import JsonlLogger

    outside = tmp_path / "outside.npz"
    outside.write_bytes(b"not the run's")
    run = tmp_path / "run"
    run.mkdir()
    log = JsonlLogger(run)
    for step, name in ((2, "eval/a.npz"), (4, "../outside.npz"), (6, str(outside))):
        log.log({"step": step, "doc_bins": name})
    assert log.truncate_after(6) is None                       # nothing newer: nothing kept aside
    kept = log.truncate_after(2)
    assert kept == run / "redone_after_step2" and outside.read_bytes() == b"not the run's"
    assert [json.loads(line)["step"] for line in (kept / "evaluations.jsonl").read_text().splitlines()] == [4, 6]
    log.log({"step": 4})
    assert log.truncate_after(2) == run / "redone_after_step2.2"   # a second resume from one step: its own folder


def test_non_finite_weights_are_refused_before_a_resume_or_init_from_trains(compose, tiny, nine_steps, tmp_path):
    """A checkpoint holding NaN weights trains nothing (its first loss is NaN): resume and init_from refuse it by
    name before any work, as evaluate does."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(nine_steps, run)
    path = run / "checkpoints" / "step_00000009.pt"
    state = torch.load(path, weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    torch.save(state, path)
    before = snapshot(run)
    with pytest.raises(ValueError, match=rf"trainer\.resume: {path}: non-finite weights \({name} holds NaN"):
        Trainer(compose(*tiny, "trainer.max_steps=12", "trainer.resume=true", f"run_dir={run}"))
    assert snapshot(run) == before
    with pytest.raises(ValueError, match=rf"trainer\.init_from: {path}: non-finite weights \({name} holds NaN"):
        Trainer(compose(*tiny, f"trainer.init_from={path}", f"run_dir={tmp_path / 'new'}"))


def _damaged(nine_steps, tmp_path, edit):
    import torch

    run = tmp_path / "run"
    shutil.copytree(nine_steps, run)
    path = run / "checkpoints" / "step_00000009.pt"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    return run, path


def _wrong_moment(state):
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"] = first["exp_avg"].flatten()[:3].clone()


@pytest.mark.parametrize("edit,part,says", [
    (lambda s: s["rng"].update(per_rank=[]), "rng", "per_rank holds no rank's RNG state"),
    (lambda s: s["trainer"].update(tokens="lots"), "trainer", "tokens='lots' is not a count >= 0"),
    (lambda s: s["trainer"].update(elapsed=-1.0), "trainer", "elapsed=-1.0 is not a number >= 0"),
    (lambda s: s["data"].update(batch=-7), "data", "data state: batch=-7 is not a batch count >= 0"),
    (_wrong_moment, "optimizer", "exp_avg has shape (3,)"),
])
def test_a_checkpoint_part_that_does_not_fit_is_one_line_naming_it(compose, tiny, nine_steps, tmp_path, edit, part,
                                                                   says):
    """A damaged or edited checkpoint whose parts load (torch reads it) but do not fit: refused naming the file and
    the part before any step, not a traceback at the first step (a moment of the wrong shape, a count that is a
    string) nor accepted (a negative data position)."""
    run, path = _damaged(nine_steps, tmp_path, edit)
    before = snapshot(run)
    with pytest.raises(ValueError, match=rf"trainer\.resume: {path}: its {part} state cannot be loaded .*"
                                         + says.replace("(", r"\(").replace(")", r"\)")):
        Trainer(compose(*tiny, "trainer.max_steps=12", "trainer.resume=true", f"run_dir={run}"))
    assert snapshot(run) == before


def test_init_from_the_weights_file_beside_a_checkpoint(compose, tiny, nine_steps, tmp_path):
    """trainer.init_from may name a step_*.safetensors (read without unpickling, as load_run reads it): the same
    weights as its checkpoint, and the tokens trained before counted to its step."""
    import torch

    weights = nine_steps / "checkpoints" / "step_00000006.safetensors"
    from_weights = Trainer(compose(*tiny, f"trainer.init_from={weights}", f"run_dir={tmp_path / 'a'}"))
    from_pt = Trainer(compose(*tiny, f"trainer.init_from={weights.with_suffix('.pt')}", f"run_dir={tmp_path / 'b'}"))
    a, b = from_weights.model.state_dict(), from_pt.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    six = next(r for r in records(nine_steps) if r["step"] == 6)
    assert from_weights.prior_tokens == from_pt.prior_tokens == six["tokens"]


def test_a_checkpoint_holding_another_step_than_its_name_is_refused(compose, tiny, nine_steps, tmp_path):
    """A checkpoint is named by the step it holds: one edited to another step (it resumed as 'complete at step
    1000000000' and then reported step 9) or renamed is unreadable, naming both steps; the resume falls back to the
    older one kept beside it, saying so."""
    run, path = _damaged(nine_steps, tmp_path, lambda s: s["trainer"].update(step=10 ** 9))
    with pytest.raises(ckpt.CheckpointError, match=r"it holds step 1000000000, its name step 9"):
        ckpt.read(path, ("trainer",))
    trainer = Trainer(compose(*tiny, "trainer.max_steps=12", "trainer.resume=true", f"run_dir={run}"))
    assert trainer.step == 6
