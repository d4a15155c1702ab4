"""kill -9 at random moments (checkpoint writes included): every restart resumes, no checkpoint is ever
corrupt, and the final metrics equal an uninterrupted run's exactly (deterministic CPU settings)."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longctx.train import checkpoint as ckpt
from longctx.train.data import resolve_splits
from _resumed import assert_same_records, records

REPO = Path(__file__).resolve().parents[2]
MAX_KILLS = 6          # kills at random moments; then the run is let finish
MAX_STEPS = 48


def last_record(run_dir: Path) -> dict:
    logged = records(run_dir)
    assert [r["step"] for r in logged] == sorted({r["step"] for r in logged}), "duplicate or unordered evals"
    return logged


def newest_step(run_dir: Path) -> int:
    return max((int(p.name[5:13]) for p in (run_dir / "checkpoints").glob("step_*.pt")), default=0)


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_equals_uninterrupted(train_env, tiny, compose, tmp_path):
    cfg = compose(*tiny)
    resolve_splits(cfg.data, cfg.ctx)  # generate the dataset first: the timing below is the run's alone
    args = [*tiny, f"trainer.max_steps={MAX_STEPS}", "trainer.eval_every=3", "trainer.num_threads=1", "trainer.resume=auto"]
    cmd = [sys.executable, str(REPO / "train.py"), *args]
    start = time.time()
    clean = subprocess.run([*cmd, f"hydra.run.dir={tmp_path / 'clean'}"], env=train_env, capture_output=True,
                           text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]
    duration = time.time() - start  # start-up included: kills land anywhere from imports to the last write

    rng = random.Random(1234)
    run = tmp_path / "killed"
    kills, resumed = 0, 0
    for attempt in range(MAX_KILLS + 1):
        proc = subprocess.Popen([*cmd, f"hydra.run.dir={run}"], env=train_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        # after MAX_KILLS kills the run may finish: a slower machine (or start-up taking most of a window) could
        # otherwise kill every attempt before its next checkpoint. Each kill lands within the time this attempt
        # needs at the least (the clean run's, scaled by the steps left after the newest checkpoint), so a resumed
        # attempt cannot finish before its kill and every attempt but the last is interrupted
        last = attempt == MAX_KILLS
        left = max(1 - newest_step(run) / MAX_STEPS, 0.05)
        try:
            # communicate, not wait: it drains the pipes, so a chatty run cannot block on a full one
            out, err = proc.communicate(timeout=600 if last else rng.uniform(0.2, 0.7) * duration * left)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            if last:
                pytest.fail("the run never finished (600 s after the last kill)")
            kills += 1
            # whatever is under a checkpoint's final name must load, every part of it
            for path in (run / "checkpoints").glob("step_*.pt"):
                ckpt.read(path, ckpt.PARTS)
            continue
        assert proc.returncode == 0, err[-3000:]
        resumed += "resuming from" in out
        break
    assert kills == MAX_KILLS, "an attempt finished before its kill; the schedule must interrupt every one"
    assert_same_records(last_record(tmp_path / "clean"), last_record(run))
