"""A stop signal (SIGTERM: a scheduler's time limit or scripts/run_points.py's deadline; SIGUSR1: Slurm's
`--signal`) ends a run after the step in progress with that step's checkpoint, between evaluations too, and the
relaunched run logs exactly what an uninterrupted one logs (train_loss included: the loss since the last
evaluation is part of the checkpoint)."""
from __future__ import annotations

import os
import signal

import pytest

from longctx.train.checkpoint import list_checkpoints
from longctx.train.stop import StopRequested, StopSignals
from longctx.train.trainer import Trainer
from _resumed import assert_same_records, records

def _parent(proc_dir) -> int | None:
    """The parent pid of a /proc/<pid> entry (None if it ended meanwhile)."""
    try:
        return int(proc_dir.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_stop_signals_set_a_flag_and_restore_the_handlers(capsys):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    with StopSignals() as stop:
        assert stop.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == signal.SIGUSR1     # handled: the process lives on
    assert {s: signal.getsignal(s) for s in before} == before
    # Ctrl-C: the first stops after the step (said once), the second aborts at once
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGINT
        assert "Ctrl-C: stopping after this step" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before
    # a process that ignores SIGINT (a job started in the background) keeps ignoring it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.received is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before[signal.SIGINT])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_a_stopped_run_resumes_as_if_never_stopped(compose, tiny, tmp_path, monkeypatch, signum):
    args = [*tiny, "trainer.max_steps=10", "trainer.eval_every=4"]
    clean = tmp_path / "clean"
    Trainer(compose(*args, f"run_dir={clean}")).fit()

    stopped = tmp_path / "stopped"
    trainer = Trainer(compose(*args, f"run_dir={stopped}"))
    step = trainer.train_step

    def train_step_signalled_at_6(batch):       # the signal arrives while step 6 trains (evaluations: 4, 8)
        if trainer.step == 5:
            os.kill(os.getpid(), signum)
        return step(batch)

    monkeypatch.setattr(trainer, "train_step", train_step_signalled_at_6)
    with pytest.raises(StopRequested, match=f"stopped by {signal.Signals(signum).name} after step 6"):
        trainer.fit()
    assert [s for s, _ in list_checkpoints(stopped)][-1] == 6          # step 6 kept, not only step 4
    assert [r["step"] for r in records(stopped)] == [4]
    assert "final (step" not in (stopped / "train.log").read_text()    # a stopped run does not look finished

    Trainer(compose(*args, "trainer.resume=true", f"run_dir={stopped}")).fit()
    assert [r["step"] for r in records(clean)] == [4, 8, 10]
    assert_same_records(records(clean), records(stopped))


def wait_for_step(proc, log, step: int, timeout: float = 300) -> None:
    """Until the run's console log shows `step` (or the process ends, or `timeout` seconds pass)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and f"step {step:>6d}/" in log.read_text():
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_the_stop_message_gives_the_command_that_resumes(train_env, tiny, tmp_path):
    """train.py stopped by SIGTERM names the command that continues it; that command, run as printed from the same
    folder, resumes the run and finishes it (the launch's own command alone is refused: the folder holds a run)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    args = [*tiny, "trainer.num_threads=1", "trainer.max_steps=200", "trainer.eval_every=100",
            "logger.console_every=1", f"hydra.run.dir={run}"]
    proc = subprocess.Popen([sys.executable, str(repo / "train.py"), *args], env=train_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(proc, run / "train.log", 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    said = [line for line in (out + err).splitlines() if line.startswith("stopped by SIGTERM after step ")]
    assert len(said) == 1, said  # said once, on stdout (and in train.log)
    line = said[0]
    command = line.split("; continue it with: ", 1)[1]
    assert command.endswith(" trainer.resume=true") and f"hydra.run.dir={run}" in command
    env = {**train_env, "PATH": f"{Path(sys.executable).parent}:{train_env['PATH']}"}  # `python`: this interpreter
    again = subprocess.run(command, shell=True, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stdout
    assert [r["step"] for r in records(run)] == [100, 200]


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(train_env, tiny, tmp_path):
    """DDP (2 gloo processes): SIGTERM to rank 1 alone; both ranks stop after one step, whose checkpoint rank 0
    writes, and the relaunch finishes the run."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run = tmp_path / "ddp"
    args = [*tiny, "trainer.num_threads=1", "trainer.max_steps=400", "trainer.eval_every=200",
            "logger.console_every=1", f"hydra.run.dir={run}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(repo / "train.py"),
           *args]
    proc = subprocess.Popen(cmd, env=train_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_step(proc, run / "train.log", 5)
    workers = [d.name for d in Path("/proc").iterdir() if d.name.isdigit() and _parent(d) == proc.pid]
    ranks = {}
    for pid in workers:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next(int(v.split(b"=")[1]) for v in env if v.startswith(b"RANK="))
        ranks[rank] = int(pid)
    assert sorted(ranks) == [0, 1], workers
    os.kill(ranks[1], signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, "torchrun reports its workers' exit"
    steps = [s for s, _ in list_checkpoints(run)]
    assert len(steps) == 1 and 5 <= steps[0] < 200, steps               # the stopped step, not an evaluation's
    assert f"stopped by SIGTERM after step {steps[0]}" in (run / "train.log").read_text()
    again = subprocess.run([*cmd, "trainer.resume=true"], env=train_env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["step"] for r in records(run)] == [200, 400]


def test_a_second_ctrl_c_aborts_during_a_long_torch_op():
    """A Python signal handler waits for the op the main thread is in: a second Ctrl-C during one long torch op (a CPU
    step at a long context) still ends the process within ABORT_GRACE_S, saying so, with the exit code of SIGINT."""
    import subprocess
    import sys
    import time

    from longctx.train.stop import ABORT_GRACE_S, ABORT_LINE

    child = ("import os, signal, sys, torch\n"
             "from longctx.train.stop import StopSignals\n"
             "torch.set_num_threads(1)\n"
             "a = torch.randn(3000, 3000, dtype=torch.float64)\n"
             "with StopSignals():\n"
             "    os.kill(os.getpid(), signal.SIGINT)\n"
             "    print('ready', flush=True)\n"
             "    for _ in range(100):\n"
             "        torch.linalg.matrix_power(a, 64)      # seconds in C++ without a Python step\n"
             "print('finished', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT and "finished" not in out, (proc.returncode, out, err)
    assert ABORT_LINE in err and took < ABORT_GRACE_S + 10, (took, err)
