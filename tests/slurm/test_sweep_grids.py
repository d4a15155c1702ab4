"""The sweep scripts' grids compose with the real config: every point, every launcher (no Slurm needed).

`scripts/slurm/sweep_paper.sh GRID --dry-run` prints the command it would run; each grid point of it
is composed here with `hydra.compose` on conf/, as train.py would compose it.
"""
from __future__ import annotations

import itertools
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "scripts" / "slurm" / "sweep_paper.sh"
# grid -> number of points with the default SEEDS=0
GRIDS = {"main": 4 * 3 * 3, "ctx": 4 * 7, "reshape": 3, "smoke": 4 * 2}


def _dry_run(grid: str, launcher: str, *extra: str, **env: str) -> list[list[str]]:
    """The commands `sweep_paper.sh` would run, each split into its words."""
    out = subprocess.run(["bash", str(SWEEP), grid, "--launcher", launcher, "--dry-run", *extra],
                         cwd=REPO, env={**os.environ, "DATA_PATH": "/data/lc64", **env},
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


def _axes(overrides: list[str]) -> list[list[str]]:
    """Hydra's comma sweeps (`k=a,b`) as lists of plain overrides (a fixed override: a list of one)."""
    return [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")] if "," in o else [o]
            for o in overrides]


def _points(overrides: list[str]) -> list[list[str]]:
    """The cartesian product of the sweeps: every grid point."""
    return [list(p) for p in itertools.product(*_axes(overrides))]


def _covering(overrides: list[str]) -> list[list[str]]:
    """A few grid points that together use every swept value (composing all would take a minute;
    a value that fails to compose fails at any point)."""
    axes = _axes(overrides)
    return [[axis[i % len(axis)] for axis in axes] for i in range(max(map(len, axes)))]


@pytest.fixture(scope="module", autouse=True)
def _hydra():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield


def _compose(overrides: list[str]):
    return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def _check_point(cfg, grid: str, point: list[str]) -> None:
    values = dict(o.split("=", 1) for o in point)
    if "attention" in values:
        assert cfg.attention.name == values["attention"]
    if "ctx" in values:
        assert cfg.ctx == int(values["ctx"])
    assert cfg.logger.wandb.group == f"paper-{grid}-gpt2"
    if grid != "smoke":
        assert cfg.data.name == "longcrawl64" and cfg.data.path == "/data/lc64"
    if cfg.attention.name == "power":
        assert cfg.attention.p == 2
    if cfg.attention.name == "window" and grid == "smoke":
        assert cfg.attention.window < cfg.ctx   # not softmax under another name


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_submitit_grid_composes(grid):
    (cmd,) = _dry_run(grid, "slurm")
    assert cmd[1:4] == ["train.py", "-m", "hydra/launcher=submitit_slurm"], cmd
    assert len(_points(cmd[3:])) == GRIDS[grid]
    for point in _covering(cmd[3:]):
        cfg = _compose(point)
        assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.tasks_per_node == 1
        _check_point(cfg, grid, point)


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_sbatch_grid_composes(grid):
    cmds = _dry_run(grid, "sbatch", SBATCH_ARGS="--nodes=2 --gpus-per-node=8")
    assert len(cmds) == GRIDS[grid]
    points = []
    for cmd in cmds:
        script = cmd.index("scripts/slurm/sbatch_ddp.sh")
        assert cmd[:script] == ["sbatch", f"--job-name=paper-{grid}-gpt2", "--nodes=2", "--gpus-per-node=8"]
        points.append(["trainer.resume=auto", *cmd[script + 1:]])  # what sbatch_ddp.sh hands train.py
    assert len({tuple(p) for p in points}) == len(points), "two sbatch jobs with the same overrides"
    from longctx.train.launch import check_no_sweep, check_overrides, check_under_experiment
    for point in points:   # each job is a plain train.py: its checks pass (p only where the attention reads it)
        check_overrides(point, REPO / "conf")
        check_no_sweep(point)
    for point in points[:: max(1, len(points) // 6)]:
        check_under_experiment(point, REPO / "conf")
        cfg = _compose(point)
        assert cfg.hydra.run.dir.startswith(f"runs/paper-{grid}-gpt2/")
        _check_point(cfg, grid, point)


def test_local_launcher_and_extra_overrides():
    (cmd,) = _dry_run("smoke", "local", "trainer.max_steps=5", SEEDS="0,1")
    assert "hydra/launcher=submitit_slurm" not in cmd and cmd[-1] == "trainer.max_steps=5"
    points = _points(cmd[3:])
    assert len(points) == 2 * GRIDS["smoke"]
    assert all(_compose(p).trainer.max_steps == 5 for p in points[:2])


@pytest.mark.parametrize("launcher", ["sbatch", "local"])
def test_extra_overrides_of_a_swept_key_or_sweeps_inside_a_job_are_refused(launcher):
    def refusal(*extra):
        proc = subprocess.run(["bash", str(SWEEP), "smoke", "--launcher", launcher, "--dry-run", *extra], cwd=REPO,
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and not proc.stdout, proc.stdout   # nothing printed as submitted
        return proc.stderr.strip()
    assert refusal("attention=power") == ("sweep_paper.sh: attention=power: the smoke grid sweeps attention (every "
                                          "point would get this one value)")
    assert refusal("seed=0,1").endswith("sweeps seed (SEEDS=0,1 sets the grid's seeds)")
    if launcher == "sbatch":
        assert "several values are a sweep" in refusal("optim.lr=1e-3,3e-3")
    (cmd, *_) = _dry_run("smoke", launcher, "+optim.betas=[0.9,0.95]")   # a list's commas are not a sweep
    assert cmd[-1] == "+optim.betas=[0.9,0.95]"


def test_real_grids_need_data_path():
    proc = subprocess.run(["bash", str(SWEEP), "main"], cwd=REPO, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "DATA_PATH"}, timeout=30)
    assert proc.returncode == 2 and "DATA_PATH" in proc.stderr


@pytest.mark.parametrize("script", ["scripts/slurm/sbatch_ddp.sh", "scripts/slurm/sweep_paper.sh",
                                    ".ci/slurm_setup.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True, timeout=30)


# ----- the small experiments' grids (scripts/slurm/sweep_experiment.sh NAME: `train.py -m experiment=NAME`) -----
EXPERIMENT_SWEEP = REPO / "scripts" / "slurm" / "sweep_experiment.sh"
# experiment -> points with one seed; every point runs the staged recipe (its last stage's context)
EXPERIMENT_GRIDS = {"attention_equal_state": (7, {4096}), "best_context_table": (3, {1024, 4096}),
                    "attention_long_context": (4, {16384}), "flops_frontier": (6, {16384}),
                    "context_scaling": (12, {1024, 4096, 16384}), "reshape_ablation": (6, {1024, 2048, 4096}),
                    "icl_vs_batch": (3, {4096}), "icl_vs_params": (3, {4096})}


def _experiment_grid(name: str, *extra: str) -> tuple[list[str], list[list[str]]]:
    """The command sweep_experiment.sh prints for `name`, and every point of its sweep (the experiment's own axes
    from hydra.sweeper.params, then the command line's)."""
    out = subprocess.run(["bash", str(EXPERIMENT_SWEEP), name, "--launcher", "slurm", "--dry-run", *extra], cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=30).stdout
    (cmd,) = [shlex.split(line) for line in out.splitlines() if line.strip()]
    params = _compose([f"experiment={name}"]).hydra.sweeper.params
    own = [f"{key}={value}" for key, value in params.items()]
    return cmd, _points(own + [o for o in cmd[4:] if "," in o])


@pytest.mark.parametrize("name", sorted(EXPERIMENT_GRIDS))
def test_experiment_grid_composes_every_point_staged(name):
    """Every point of a small experiment's grid composes with its Slurm launcher and runs the staged recipe: a first
    stage at ctx 1024 from scratch, the point's own context last; three seeds triple the grid."""
    size, contexts = EXPERIMENT_GRIDS[name]
    cmd, points = _experiment_grid(name)
    assert cmd[1:5] == ["train.py", "-m", f"experiment={name}", "hydra/launcher=submitit_slurm"], cmd
    assert len(points) == size
    seen = set()
    for point in points:
        cfg = _compose([f"experiment={name}", *[o for o in cmd[4:] if "," not in o], *point])
        assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.gpus_per_node == 1
        assert cfg.logger.wandb.group == name and cfg.arch.token_shift is True
        stages = list(cfg.trainer.stages)
        assert len(stages) >= 2 and stages[-1] == {} and stages[0]["ctx"] == 1024
        seen.add(cfg.ctx)
    assert seen == contexts
    assert len(_experiment_grid(name, "seed=0,1,2")[1]) == 3 * size
