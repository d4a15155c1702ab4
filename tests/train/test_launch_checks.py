"""One process per run folder (an flock the OS drops when its holder dies), run folders that stay where they belong,
sweep folders that hold one sweep, and launch mistakes (a run folder that is a file, a Slurm launcher without
Slurm, a bad value that `--cfg` would only print) as one line, exit 2, nothing written."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longctx.train import run_dir as run_dir_module
from longctx.train.run_dir import RunDirInUse, RunLock, check_writable_dir
from longctx.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def train(args, env, cwd, **kw):
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600, **kw)


def test_same_run_name_launched_twice_the_second_fails_naming_the_first(train_env, tiny, tmp_path):
    """Two launches with one run_name (seeds 1 and 2): while the first runs, the second fails in one line naming
    it (pid, host, start), exit 2, and the folder is left as the first made it."""
    name = ["run_name=shared", "logger.console_every=100000", "trainer.eval_every=100000"]
    first = subprocess.Popen([sys.executable, str(REPO / "train.py"), *tiny, *name, "seed=1",
                              "trainer.max_steps=1000000"], env=train_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    run = tmp_path / "runs" / "shared"
    try:
        deadline = time.monotonic() + 300
        # the first launch's last line before its (far) first evaluation: its step time measured after 3 steps
        while " s/step -> " not in ((run / "train.log").read_text() if (run / "train.log").exists() else ""):
            assert first.poll() is None and time.monotonic() < deadline, "the first launch never started training"
            time.sleep(0.2)
        before = snapshot(run)
        second = train([*tiny, *name, "seed=2", "trainer.max_steps=2"], train_env, tmp_path)
        after = snapshot(run)
        assert first.poll() is None, "the first launch must still be running"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith(f"error: run_dir='{run}' is in use by pid {first.pid} on host {socket.gethostname()} "
                           f"(started "), line
    assert after == before
    assert "seed: 1" in (run / "config.yaml").read_text() and not (run / "metrics.jsonl").exists()


def test_lock_of_a_killed_process_is_released(tmp_path):
    """kill -9 of the holder: the kernel drops its flock; the next launch takes the folder over."""
    run = tmp_path / "run"
    script = ("import sys, time\nfrom longctx.train.run_dir import RunLock\nlock = RunLock(sys.argv[1])\n"
              "lock.acquire()\nprint('held', flush=True)\ntime.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", script, str(run)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunDirInUse, match=f"in use by pid {holder.pid} on host"):
        RunLock(run).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (run / ".lock").exists()  # left behind by the killed holder, but no longer held
    lock = RunLock(run)
    lock.acquire()
    lock.release()
    assert not (run / ".lock").exists()


def test_trainer_refuses_a_held_run_dir_before_writing(compose, tiny, train_run, tmp_path):
    run = train_run(tmp_path / "run", tiny)
    before = snapshot(run)
    lock = RunLock(run)
    lock.acquire()  # another process's run, as far as the trainer can tell (a second open file of the lock)
    try:
        with pytest.raises(RunDirInUse, match=f"is in use by pid {os.getpid()} on host"):
            Trainer(compose(*tiny, "trainer.resume=true", "trainer.max_steps=9", f"run_dir={run}"))
    finally:
        lock.release()
    assert snapshot(run) == before
    fresh = RunLock(tmp_path / "fresh")
    fresh.acquire()
    with pytest.raises(RunDirInUse):
        Trainer(compose(*tiny, f"run_dir={tmp_path / 'fresh'}"))
    fresh.release(undo=True)
    assert not (tmp_path / "fresh").exists()
    trainer = Trainer(compose(*tiny, f"run_dir={tmp_path / 'fresh'}"))  # released, the folder is free again
    assert (tmp_path / "fresh" / ".lock").exists()
    trainer.close()
    assert not (tmp_path / "fresh" / ".lock").exists()


def test_unwritable_run_dir_is_named(tmp_path, monkeypatch):
    """A folder the user cannot write (tested by permission bits: root passes them, so os.access is stood in)."""
    target = tmp_path / "ro" / "run"
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(run_dir_module.os, "access", lambda path, mode: Path(path) != tmp_path / "ro")
    with pytest.raises(ValueError, match=r"run_dir='.*ro/run' cannot be created: '.*ro' is not writable"):
        check_writable_dir(target, "run_dir")
    with pytest.raises(ValueError, match=r"run_dir='.*ro' is not writable"):
        RunLock(tmp_path / "ro").acquire()
    assert sorted(os.listdir(tmp_path / "ro")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_run_dir_cli(train_env, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    out = train([f"hydra.run.dir={ro / 'run'}"], train_env, tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: hydra.run.dir='{ro / 'run'}' cannot be created: '{ro}' is not writable; pick another folder"]


def test_cli_launch_mistakes_are_one_line_exit_2_nothing_written(train_env, tiny, tmp_path):
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    escape = train([*tiny, "run_name=../../x"], train_env, nested)
    assert escape.returncode == 2 and escape.stderr.strip().splitlines() == [
        "error: config: run_name='../../x': has a '.', '..' or '\\' path component; the run folder must stay inside "
        "runs/ (use a plain name such as my_run, or hydra.run.dir=<folder> for another place)"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["a", "a/b"]

    a_file = tmp_path / "taken"
    a_file.write_text("not a folder\n")
    out = train([*tiny, f"hydra.run.dir={a_file}"], train_env, tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: hydra.run.dir='{a_file}' is a file, not a folder; pick another run_name or folder"]
    assert a_file.read_text() == "not a folder\n"

    for args, message in [(["attention=power", "p=7"], "config: p=7: power attention supports integer degrees 1..4"),
                          (["optim.lr=abc"], "config: optim.lr='abc': must be a number")]:
        shown = train(["--cfg", "job", *args], train_env, tmp_path)
        assert shown.returncode == 2 and shown.stderr.strip().splitlines() == [f"error: {message}"], shown.stderr
        assert shown.stdout == ""
    assert train(["--cfg", "job", "seed=3"], train_env, tmp_path).stdout.count("seed: 3") == 1  # a good config prints

    # a sweep over a key the run names do not show: its jobs would share one folder (the second resuming the first)
    hidden = train(["-m", "trainer.icl_bins=10,20", f"hydra.sweep.dir={tmp_path / 'hidden'}", *tiny], train_env,
                   tmp_path)
    assert hidden.returncode == 2 and hidden.stderr.strip().splitlines() == [
        "error: config: trainer.icl_bins=10,20: the run names of a sweep do not show trainer.icl_bins, so its jobs "
        "would share one run folder (the second resuming the first); launch one sweep per value (each with its own "
        "hydra.sweep.dir), or set hydra.sweep.subdir"], hidden.stderr[-2000:]
    assert not (tmp_path / "hidden").exists()

    sweep = tmp_path / "sweep"
    env = {**train_env, "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    slurm = train(["-m", "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={sweep}", *tiny], env, tmp_path)
    if slurm.returncode != 2 and "sbatch" in os.popen("command -v sbatch").read():
        pytest.skip("this machine has Slurm")
    assert slurm.returncode == 2 and slurm.stderr.strip().splitlines() == [
        "error: hydra/launcher=submitit_slurm: no Slurm here (sbatch is not on PATH); launch from a Slurm login "
        "node, or drop hydra/launcher to run the sweep on this machine"], slurm.stderr[-2000:]
    assert not sweep.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "taken"]


def test_reused_sweep_folder_with_other_overrides_is_refused(train_env, tiny, tmp_path):
    """A second -m sweep into one hydra.sweep.dir with other overrides would mix two sweeps under one multirun.yaml:
    refused naming the overrides that differ (other values of a sweep axis are not a difference: they name other
    jobs), before anything is written."""
    sweep = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep}", *tiny, "trainer.max_steps=2", "trainer.eval_every=2"]
    first = train([*args, "seed=0"], train_env, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(sweep)
    again = train([*args, "seed=0,1", "optim.lr=1e-3"], train_env, tmp_path)
    assert again.returncode == 2, again.stderr[-2000:]
    (line,) = again.stderr.strip().splitlines()
    assert line.startswith(f"error: hydra.sweep.dir='{sweep}' already holds a sweep launched with other overrides "
                           f"(optim.lr=1e-3 (new)); relaunch it with its own overrides"), line
    assert snapshot(sweep) == before


def test_a_bad_value_anywhere_in_a_sweep_grid_is_named_before_any_job(train_env, tiny, tmp_path):
    """`-m attention=power p=2,7`: the second job's p=7 is refused when the sweep is launched, in one line naming the
    value and the job, exit 2, with no sweep folder made and no job trained (the first job used to train, the second
    to fail when it started)."""
    sweep = tmp_path / "sweep"
    out = train(["-m", "attention=power", "p=2,7", f"hydra.sweep.dir={sweep}", *tiny], train_env, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: config: p=7: power attention supports integer degrees 1..4 (sweep job 2 of 2: p=7); no job was "
        "launched"]
    assert not sweep.exists() and "Launching" not in out.stdout + out.stderr


def test_every_job_of_a_recipe_grid_and_the_command_lines_axes_is_checked():
    """The grid is the basic sweeper's: a recipe's hydra.sweeper.params crossed with the command line's axes. The first
    bad job is named with its swept values and its place; a grid of good values, a glob sweep (Hydra expands it) and
    a single job pass (the run checks its own config)."""
    from longctx.train.launch import check_sweep_jobs, sweep_jobs

    conf = REPO / "conf"
    jobs = sweep_jobs(["experiment=recall_state_cpu", "optim.lr=1e-3,-1"], conf)
    assert len(jobs) == 4 * 2 * 2 and jobs[1] == ["+experiment/arm=exp", "data.n_pairs=2",
                                             "experiment=recall_state_cpu", "optim.lr=-1"]
    with pytest.raises(ValueError) as caught:
        check_sweep_jobs(["experiment=recall_state_cpu", "optim.lr=1e-3,-1"], conf)
    assert str(caught.value) == ("config: optim.lr=-1: must be > 0 (sweep job 2 of 16: +experiment/arm=exp "
                                 "data.n_pairs=2 optim.lr=-1); no job was launched")
    with pytest.raises(ValueError, match=r"^config: ctx=0: must be a positive integer \(sweep job 2 of 4: seed=0 "):
        check_sweep_jobs(["seed=0,1", "ctx=64,0"], conf)
    for good in (["experiment=recall_state_cpu"], ["attention=power", "p=2,3"], ["data=glob(icl_*)", "seed=0,1"],
                 ["ctx=0"], ["run_name=trial", "seed=0,1", "hydra.sweep.subdir=${hydra.job.num}"]):
        check_sweep_jobs(good, conf)
    # jobs whose names do not tell them apart (exp does not show p; a fixed run_name; two datasets' folders of one
    # name) would train in one folder: refused before any job, naming the two
    for grid, first, second, name in [
            (["attention=exp,power", "p=2,3"], "1 (attention=exp p=2)", "2 (attention=exp p=3)", "gpt2_exp_"),
            (["run_name=trial", "seed=0,1"], "1 (seed=0)", "2 (seed=1)", "trial,"),
            (["data=longcrawl64", "data.path=/a/data,/b/data"], "1 (data.path=/a/data)", "2 (data.path=/b/data)",
             "gpt2_exp_d64l3_data_")]:
        with pytest.raises(ValueError) as caught:
            check_sweep_jobs(grid, conf)
        said = str(caught.value)
        assert said.startswith(f"config: sweep jobs {first} and {second} of ") and f"both named {name}" in said, said
        assert said.endswith("or set hydra.sweep.subdir; no job was launched")
