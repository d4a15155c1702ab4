"""tools/recall_grid.sh without a GPU: the grid it hands scripts/run_points.py for each experiment (python3 and the
device setup stubbed; the arguments recorded)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _calls(tmp_path, **env) -> list:
    """The argument lists of every run_points call the script made."""
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "recall_grid.sh", tmp_path / "tools")
    (tmp_path / "tools" / "setup_device.sh").write_text("")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stub = bin_ / "python3"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" ---CALL--- >> "$ARGS_FILE"\n')
    stub.chmod(0o755)
    args = tmp_path / "args.txt"
    run_env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", ARGS_FILE=str(args), OUT=str(tmp_path / "out"),
                   **env)
    proc = subprocess.run(["bash", "tools/recall_grid.sh"], cwd=tmp_path, env=run_env, capture_output=True,
                          text=True, timeout=60)
    assert args.exists(), proc.stderr[-2000:]
    return [c.strip("\n").split("\n") for c in args.read_text().split("---CALL---") if c.strip()]


def _grid_args(tmp_path, **env) -> list:
    (call,) = _calls(tmp_path, **env)
    return call


def _grids(args) -> dict:
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--grid")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_widths_experiment_grids_model_sizes_at_one_n(tmp_path):
    args = _grid_args(tmp_path, EXPERIMENT="recall_state_widths", ARMS="exp,linear", LRS="")
    assert "experiment=recall_state_widths" in args and args[args.index("--dir") + 1] == "multirun/recall_state_widths"
    assert _grids(args) == {"+experiment/arm": "exp,linear", "data.n_pairs": "256", "seed": "0,1,2",
                            "+experiment/size": "d64l2,d256l2,d512l2"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_default_grid_has_no_size_axis(tmp_path):
    args = _grid_args(tmp_path, NPAIRS="64")
    assert _grids(args) == {"+experiment/arm": "exp,window,power_p2,power_p3,power_p4,linear,window_linear_state",
                            "data.n_pairs": "64", "seed": "0,1,2", "optim.lr": "1e-3,3e-3"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_extra_overrides_reach_every_point_in_their_own_folder(tmp_path):
    args = _grid_args(tmp_path, EXPERIMENT="recall_state_long", NPAIRS="256", ARMS="exp", LRS="3e-3",
                      EXTRA="trainer.max_steps=1800 trainer.eval_every=300", DIR="multirun/long_1800")
    assert args[args.index("--dir") + 1] == "multirun/long_1800"
    assert {"experiment=recall_state_long", "trainer.max_steps=1800", "trainer.eval_every=300"} <= set(args)
    assert _grids(args) == {"+experiment/arm": "exp", "data.n_pairs": "256", "seed": "0,1,2", "optim.lr": "3e-3"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_each_arm_at_its_own_rate_shares_the_jobs_and_the_folder(tmp_path):
    calls = _calls(tmp_path, EXPERIMENT="recall_state_widths", JOBS="20",
                   ARM_LRS="exp=3e-3,window=3e-3,power_p2=3e-3,linear=1e-3")
    by_rate = {_grids(c)["optim.lr"]: c for c in calls}
    assert set(by_rate) == {"3e-3", "1e-3"}
    assert _grids(by_rate["3e-3"])["+experiment/arm"] == "exp,window,power_p2"
    assert _grids(by_rate["1e-3"])["+experiment/arm"] == "linear"
    for c in calls:
        assert c[c.index("--dir") + 1] == "multirun/recall_state_widths"
        assert _grids(c)["+experiment/size"] == "d64l2,d256l2,d512l2" and _grids(c)["data.n_pairs"] == "256"
        assert c.count("--grid") == 5      # seed, arm, N, size, rate: ARM_LRS's rate only
    # 20 jobs by the number of arms, rounded up: 15 for three arms, 5 for one
    assert [int(by_rate[r][by_rate[r].index("--jobs") + 1]) for r in ("3e-3", "1e-3")] == [15, 5]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("env,words", [
    ({"ARM_LRS": "exp=3e-3,linear"}, "'linear' is not ARM=RATE"),
    ({"ARM_LRS": "exp=fast"}, "'exp=fast' is not ARM=RATE"),
    ({"ARM_LRS": "exp=3e-3", "PILOT": "1"}, "the pilot grid takes PILOT_ARMS and PILOT_LRS")])
def test_a_bad_arm_lrs_is_one_line_and_nothing_runs_or_is_written(tmp_path, env, words):
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "recall_grid.sh", tmp_path / "tools")
    (tmp_path / "tools" / "setup_device.sh").write_text("touch SETUP_RAN\n")
    proc = subprocess.run(["bash", "tools/recall_grid.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OUT=str(tmp_path / "out"), **env))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tools"]    # no setup, no $OUT, no run folder
