"""Learning-rate schedule (torch's schedulers) against its closed form, on resume too; checkpoints atomic and pruned;
the checkpointer's Stateful parts."""
import math
import os

import pytest
import torch

from longctx.train import checkpoint as ckpt
from longctx.train.optim import Schedule, build_scheduler, lr_at, saved_schedule


def test_schedule_warmup_then_cosine_to_floor():
    kw = dict(lr=3e-4, min_lr=1e-5, warmup_steps=2000, max_steps=10000)
    assert math.isclose(lr_at(0, **kw), 3e-4 / 2000)
    assert math.isclose(lr_at(1999, **kw), 3e-4)
    mid = 2000 + 8000 // 2
    assert math.isclose(lr_at(mid, **kw), 1e-5 + 0.5 * (3e-4 - 1e-5))
    assert math.isclose(lr_at(10000, **kw), 1e-5)
    assert math.isclose(lr_at(20000, **kw), 1e-5)  # stays at the floor past the end
    lrs = [lr_at(s, **kw) for s in range(2000, 10001, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_checkpoints_atomic_and_keep_last(tmp_path):
    for step in (10, 20, 30):
        ckpt.save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((3,), float(step))}, keep=2)
    found = ckpt.list_checkpoints(tmp_path)
    assert [s for s, _ in found] == [20, 30]
    # a half-written temp file (a kill -9 mid-write) is never taken for a checkpoint
    (ckpt.checkpoint_dir(tmp_path) / ".step_00000040.pt.tmp123").write_bytes(b"garbage")
    step, path = ckpt.latest_checkpoint(tmp_path)
    assert step == 30 and torch.equal(ckpt.load_checkpoint(path)["w"], torch.full((3,), 30.0))
    assert not any(n.endswith(".pt") and n.startswith(".") for n in os.listdir(ckpt.checkpoint_dir(tmp_path)))


def test_no_checkpoint_in_empty_dir(tmp_path):
    assert ckpt.latest_checkpoint(tmp_path) is None


def _optimizer():
    params = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))]
    return torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=1.0)


def _run(schedule, start, steps, state=None):
    """torch's schedulers for `schedule`, built at `start` (and loaded from `state`): the lrs of the next steps."""
    optimizer = _optimizer()
    scheduler = build_scheduler(optimizer, schedule, start)
    if state is not None:
        scheduler.load_state_dict(state)
        for group in optimizer.param_groups:
            group["lr"] = scheduler.get_last_lr()[0]
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs, scheduler


@pytest.mark.parametrize("warmup,start", [(5, 0), (5, 3), (5, 7), (0, 0), (1, 0), (20, 0)])
def test_torch_schedulers_follow_the_closed_form_from_any_step(warmup, start):
    """LinearLR + CosineAnnealingLR (chainable: each lr from the previous one) against the closed form."""
    kw = dict(lr=3e-3, min_lr=1e-5, warmup_steps=warmup, max_steps=20)
    lrs, _ = _run(Schedule(**kw), start, 20 - start)
    for step, got in zip(range(start, 20), lrs):
        assert got == pytest.approx(lr_at(step, **kw), rel=1e-13, abs=0), step


def test_saved_scheduler_continues_exactly():
    """A checkpoint's scheduler state, loaded into schedulers rebuilt from its record: the same lrs, bit for bit."""
    schedule = Schedule(3e-3, 1e-5, 5, 20)
    whole, _ = _run(schedule, 0, 20)
    first, scheduler = _run(schedule, 0, 8)
    state = scheduler.state_dict()
    rebuilt = saved_schedule(state)
    assert rebuilt == schedule
    rest, _ = _run(rebuilt, rebuilt.start, 12, state)
    assert first + rest == whole


def test_resumed_schedule_recomputes_from_the_current_step():
    old = Schedule(3e-3, 1e-5, 5, 20)
    assert old.resumed(12, Schedule(3e-3, 1e-5, 5, 20)) is old  # nothing changed: the saved schedulers go on
    lower = old.resumed(12, Schedule(1e-3, 1e-6, 5, 20))        # lr/min_lr: the new closed form
    assert [lower.lr_at(t) for t in range(12, 21)] == pytest.approx(
        [lr_at(t, lr=1e-3, min_lr=1e-6, warmup_steps=5, max_steps=20) for t in range(12, 21)], rel=1e-12)
    longer = old.resumed(12, Schedule(3e-3, 1e-5, 5, 40))       # a longer run: no jump, down to min_lr at 40
    assert longer.lr_at(12) == pytest.approx(old.lr_at(12), rel=1e-12)
    assert longer.lr_at(40) == pytest.approx(1e-5) and all(
        longer.lr_at(t) > longer.lr_at(t + 1) for t in range(12, 40))
    finished = old.resumed(20, Schedule(3e-3, 1e-5, 5, 40))     # a finished run goes on at the floor
    assert [finished.lr_at(t) for t in (20, 30, 40)] == pytest.approx([1e-5] * 3)
    warming = old.resumed(3, Schedule(3e-3, 1e-5, 10, 20))      # inside the new warmup: the new warmup as written
    assert warming.lr_at(3) == pytest.approx(3e-3 * 4 / 10)
    lrs, _ = _run(longer, 12, 28)
    assert lrs == pytest.approx([longer.lr_at(t) for t in range(12, 40)], rel=1e-12)


@pytest.mark.parametrize("warmup,max_steps,fitted", [(50, 20, 2), (50, 9, 1), (7, 5, 1), (20, 20, 20), (0, 3, 0),
                                                     (2000, 1000, 100)])
def test_a_warmup_longer_than_the_run_is_a_tenth_of_it(warmup, max_steps, fitted):
    """optim.warmup_steps longer than the run becomes 10% of it (at least 1 step); the lrs are the closed form of
    that warmup, written out here, and torch's schedulers follow them."""
    from omegaconf import OmegaConf

    schedule = Schedule.from_config(OmegaConf.create({"lr": 3e-3, "min_lr": 1e-5, "warmup_steps": warmup}), max_steps)
    assert schedule.warmup_steps == fitted

    def closed_form(t):
        if t < fitted:
            return 3e-3 * (t + 1) / fitted
        progress = min(1.0, (t - fitted) / max(1, max_steps - fitted))
        return 1e-5 + 0.5 * (3e-3 - 1e-5) * (1 + math.cos(math.pi * progress))

    assert [schedule.lr_at(t) for t in range(max_steps + 1)] == pytest.approx(
        [closed_form(t) for t in range(max_steps + 1)], rel=1e-13)
    if fitted:
        assert schedule.lr_at(fitted - 1) == pytest.approx(3e-3)  # the peak is reached
    lrs, _ = _run(schedule, 0, max_steps)
    assert lrs == pytest.approx([closed_form(t) for t in range(max_steps)], rel=1e-12)


def test_resume_of_a_run_with_a_scaled_warmup(compose, tiny, tmp_path, capsys):
    """The scaled warmup is recomputed the same way on resume: a run killed after its step-3 checkpoint records the
    lrs of an uninterrupted one; raising max_steps then continues its cosine, never warming up again."""
    import json
    import shutil

    from longctx.train.trainer import Trainer

    def lrs(run):
        return [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    args = [*tiny, "optim.warmup_steps=50", "trainer.keep_checkpoints=5"]  # 6 steps: warmup 50 -> 1
    full, cut = tmp_path / "full", tmp_path / "cut"
    Trainer(compose(*args, f"run_dir={full}")).fit()
    assert "warming up over 1 step instead" in capsys.readouterr().out
    shutil.copytree(full, cut)
    (cut / "checkpoints" / "step_00000006.pt").unlink()
    (cut / "metrics.jsonl").write_text((cut / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    Trainer(compose(*args, "trainer.resume=true", f"run_dir={cut}")).fit()
    assert lrs(cut) == lrs(full)
    assert "the schedule is recomputed" not in capsys.readouterr().out  # the same schedule: nothing to say

    # max_steps 6 -> 40 at step 3: warmup 50 would now be scaled to 4, a re-warming; the run's own warmup (1 step)
    # is kept and its cosine continues to 40 (the formula of docs/gpu.md (Run folders and resuming), with w = 1,
    # T = 40, s = 3)
    longer = tmp_path / "longer"
    shutil.copytree(full, longer)
    (longer / "checkpoints" / "step_00000006.pt").unlink()
    (longer / "metrics.jsonl").write_text((longer / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    Trainer(compose(*args, "trainer.resume=true", "trainer.max_steps=40", "trainer.eval_every=10",
                    f"run_dir={longer}")).fit()
    at_3 = lrs(full)[0]

    def continued(t):
        return 1e-5 + (at_3 - 1e-5) * (1 + math.cos(math.pi * (t - 1) / 39)) / (1 + math.cos(math.pi * 2 / 39))

    assert lrs(longer) == pytest.approx([at_3] + [continued(t) for t in (10, 20, 30, 40)], rel=1e-9)


def test_checkpointer_collects_stateful_parts_and_gives_each_its_own_back(tmp_path):
    """Each part's state_dict() is saved under its name beside schema_version and the meta values; reading the file
    (weights_only) and loading it restores every part, RNG draws included."""
    import random

    import numpy as np

    from longctx.train.distributed import DistInfo
    from longctx.train.rng import RNGState

    class Counters:
        step, tokens = 7, 448

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    counters = Counters()
    parts = {"model": model, "rng": RNGState(DistInfo()),
             "trainer": ckpt.Attributes(counters, {"step": 0, "tokens": 0})}
    checkpointer = ckpt.Checkpointer(tmp_path, 2, parts, meta=lambda: {"config": {"ctx": 64}, "spec": None})
    path = checkpointer.save(7, checkpointer.state_dict())
    draws = (random.random(), np.random.rand(), torch.rand(1).item())  # what the next draws are after the save

    state = ckpt.read(path, ("model", "rng", "trainer"))
    assert state["schema_version"] == ckpt.SCHEMA_VERSION and state["config"] == {"ctx": 64}
    with torch.no_grad():
        model.weight.zero_()
    counters.step = counters.tokens = 0
    random.random(), np.random.rand(), torch.rand(1)  # move every generator on
    checkpointer.load_state_dict(state)
    torch.manual_seed(0)
    assert torch.equal(model.weight, torch.nn.Linear(3, 2).weight) and (counters.step, counters.tokens) == (7, 448)
    parts["rng"].load_state_dict(state["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws
