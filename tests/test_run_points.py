"""scripts/run_points.py: grid expansion, at most --jobs at once, the deadline, and a real two-point run that a
second launch finds finished."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_grid_is_every_combination_first_axis_slowest(import_script):
    rp = import_script("run_points")
    assert rp.expand_grid(["+experiment/arm=exp,window", "seed=0,1"]) == [
        ["+experiment/arm=exp", "seed=0"], ["+experiment/arm=exp", "seed=1"],
        ["+experiment/arm=window", "seed=0"], ["+experiment/arm=window", "seed=1"]]
    assert rp.expand_grid([]) == [[]]
    assert rp.point_name(["+experiment/arm=power_p2", "seed=1"]) == "armpower_p2_seed1"
    for bad in ("seed", "seed=", "=1,2", "seed=0,,1"):
        with pytest.raises(ValueError, match="--grid"):
            rp.expand_grid([bad])


def test_points_apart_only_in_what_names_do_not_show_are_refused(import_script, tmp_path, monkeypatch):
    """Points that differ only in a key the run name does not show (trainer.eval_every) would share one folder, the
    second resuming the first: refused in one line. A swept run length (trainer.max_steps) is named, as in a
    multirun: the points pass it on (LONGCTX_SWEPT_KEYS) and each gets a folder of its own."""
    rp = import_script("run_points")
    clash = rp.shared_folder(rp.expand_grid(["seed=0,1", "trainer.eval_every=100,200"]), [])
    assert clash.startswith("--grid: points seed=0 trainer.eval_every=100 and seed=0 trainer.eval_every=200 differ "
                            "only in trainer.eval_every")
    assert rp.shared_folder(rp.expand_grid(["seed=0,1", "trainer.max_steps=2,4"]), ["trainer.max_steps"]) is None
    assert rp.shared_folder(rp.expand_grid(["seed=0,0"]), []) == "--grid: the point seed=0 comes twice (a value " \
        "repeated in an axis)"
    r = subprocess.run([sys.executable, str(REPO / "scripts/run_points.py"), "--dir", str(tmp_path),
                        "--grid", "trainer.eval_every=1,2"], capture_output=True, text=True)
    assert r.returncode == 2 and "which run names do not show" in r.stderr.strip().splitlines()[-1]
    r = subprocess.run([sys.executable, str(REPO / "scripts/run_points.py"), "--dir", str(tmp_path), "--dry-run",
                        "--grid", "trainer.max_steps=2,4"], capture_output=True, text=True)
    assert r.returncode == 0 and [line.split()[0] for line in r.stdout.splitlines()] == [
        "LONGCTX_SWEPT_KEYS=trainer.max_steps"] * 2
    import shlex  # a printed command pastes into a shell as is: ${run_name} reaches Hydra, not the shell
    assert f"hydra.run.dir={tmp_path}/${{run_name}}" in shlex.split(r.stdout.splitlines()[0])
    r = subprocess.run([sys.executable, str(REPO / "scripts/run_points.py"), "--dir", str(tmp_path), "--dry-run",
                        "trainer.max_stepz=2", "--grid", "seed=0,1"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "error: config: trainer.max_stepz=2: unknown key (no config file defines it; did you mean trainer.max_steps?)")
    for hash_seed in ("0", "2"):  # each point checked as train.py would check it, whatever the order of a set
        r = subprocess.run([sys.executable, str(REPO / "scripts/run_points.py"), "--dir", str(tmp_path), "--dry-run",
                            "--grid", "attention=exp,power", "--grid", "p=2"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
            "p=2: attention=exp does not read p (only attention=power does); add attention=power, or leave p out "
            "(the point attention=exp p=2)"), r.stderr
    from omegaconf import OmegaConf

    from longctx.naming import job_swept_keys, run_name
    cfg = OmegaConf.create({"arch": {"name": "gpt2"}, "attention": {"tag": "exp"}, "seed": 0, "ctx": 64,
                            "model": {"d_model": 32, "n_layers": 1}, "data": {"name": "mqar", "tag": "mqar_n4"}})
    names = set()
    for steps in (2, 4):
        monkeypatch.setenv("LONGCTX_SWEPT_KEYS", "trainer.max_steps")
        names.add(run_name(cfg, [f"trainer.max_steps={steps}"], job_swept_keys()))
        monkeypatch.delenv("LONGCTX_SWEPT_KEYS")
        assert run_name(cfg, [f"trainer.max_steps={steps}"], job_swept_keys()).endswith("_s0")  # a plain run
    assert len(names) == 2


def _sleepers(rp, tmp_path, seconds):
    points = [rp.Point([f"n={i}"], tmp_path / f"{i}.log") for i in range(len(seconds))]
    commands = [[sys.executable, "-c", f"import time; time.sleep({s}); print('done {i}')"]
                for i, s in enumerate(seconds)]
    return points, commands


def test_at_most_jobs_points_run_at_once(import_script, tmp_path):
    rp = import_script("run_points")
    points, commands = _sleepers(rp, tmp_path, [0.6, 0.6, 0.6])
    t0 = time.monotonic()
    rp.run(points, commands, jobs=2, deadline_s=None, poll_s=0.05)
    took = time.monotonic() - t0
    assert [p.outcome for p in points] == ["finished"] * 3
    assert 1.2 <= took < 5  # two rounds of 0.6 s, not one (3 at once) or three (1 at once)
    assert points[2].started - points[0].started >= 0.55
    assert all("done" in p.log.read_text() for p in points)


def test_deadline_stops_running_points_and_names_the_rest(import_script, tmp_path):
    rp = import_script("run_points")
    points, commands = _sleepers(rp, tmp_path, [0.1, 60, 60, 0.1])
    t0 = time.monotonic()
    rp.run(points, commands, jobs=2, deadline_s=1.0, poll_s=0.05)
    assert time.monotonic() - t0 < 10
    assert points[0].outcome == "finished"
    for p in points[1:3]:
        assert p.outcome.startswith("stopped at the deadline") and p.proc.returncode != 0
    assert points[3].outcome == "not started before the deadline"


def test_bad_arguments_are_one_line(tmp_path):
    for args, field in ((["--jobs", "0"], "--jobs=0"), (["--grid", "seed"], "--grid 'seed'"),
                        (["--gpus", "a,b"], "--gpus='a,b'"), (["--deadline-s", "-1"], "--deadline-s=-1")):
        r = subprocess.run([sys.executable, str(REPO / "scripts/run_points.py"), "--dir", str(tmp_path), *args],
                           capture_output=True, text=True)
        assert r.returncode == 2 and field in r.stderr.strip().splitlines()[-1], r.stderr


@pytest.mark.slow
def test_two_tiny_points_run_together_and_a_relaunch_skips_them(tmp_path):
    cmd = [sys.executable, str(REPO / "scripts/run_points.py"), "--jobs", "2", "--dir", str(tmp_path),
           "experiment=attention_equal_state", "+experiment/scale=cpu_tiny", "--grid",
           "+experiment/arm=exp,power_p2"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = sorted(d for d in tmp_path.iterdir() if d.name != "logs")
    assert [d.name.split("_d256")[0] for d in runs] == ["gpt2_exp", "gpt2_power_p2"]
    for d in runs:  # the staged recipe ran both stages into the folder -m gives
        rec = [json.loads(x) for x in (d / "stage2_ctx128" / "metrics.jsonl").read_text().splitlines()]
        assert rec[-1]["step"] == 2
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert again.returncode == 0 and again.stdout.count("finished") >= 2
    for d in runs:  # nothing trained twice
        assert len((d / "stage2_ctx128" / "metrics.jsonl").read_text().splitlines()) == len(rec)
