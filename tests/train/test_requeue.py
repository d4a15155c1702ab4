"""A sweep job relaunched into its own folder (hydra-submitit requeues a preempted or timed-out job so; a
Slurm `scontrol requeue` does too) continues from its checkpoint and ends exactly where an uninterrupted run
does; a finished one relaunched exits 0 saying it is complete and writes nothing."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longctx.train.data import resolve_splits
from _resumed import assert_same_records, records

REPO = Path(__file__).resolve().parents[2]


def multirun(sweep: Path, args: list[str]) -> list[str]:
    """The multirun command as a sweep launches it (no trainer.resume given: multirun makes it auto)."""
    return [sys.executable, str(REPO / "train.py"), "-m", f"hydra.sweep.dir={sweep}", *args]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_requeued_sweep_job_resumes_and_matches_an_uninterrupted_run(train_env, tiny, compose, tmp_path):
    cfg = compose(*tiny)
    resolve_splits(cfg.data, cfg.ctx)  # the dataset exists before the timing below
    args = [*tiny, "trainer.max_steps=12", "trainer.eval_every=3"]
    job = "gpt2_exp_d64l3_icl_markov_ctx64_s0_docs_per_batch8_train_tokens262144_warmup_steps2"  # what runs

    clean = subprocess.run(multirun(tmp_path / "clean", args), env=train_env, capture_output=True, text=True,
                           timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]

    # The job is preempted (kill -9) just after its step-6 checkpoint ...
    sweep = tmp_path / "requeued"
    proc = subprocess.Popen(multirun(sweep, args), env=train_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    checkpoint = sweep / job / "checkpoints" / "step_00000006.pt"
    deadline = time.monotonic() + 600
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    assert max(r["step"] for r in records(sweep / job)) < 12

    # ... and relaunched into the same folder, with the same command: it continues from the checkpoint
    again = subprocess.run(multirun(sweep, args), env=train_env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stdout and "already holds a run" not in again.stderr
    a, b = records(tmp_path / "clean" / job), records(sweep / job)
    assert [r["step"] for r in a] == [3, 6, 9, 12]
    assert_same_records(a, b)

    # A finished job relaunched (a requeue after the last checkpoint) is complete: exit 0, nothing written
    before = snapshot(sweep / job)
    done = subprocess.run(multirun(sweep, args), env=train_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{sweep / job} is complete (step 12 of trainer.max_steps=12); nothing to do" in done.stdout
    assert snapshot(sweep / job) == before
