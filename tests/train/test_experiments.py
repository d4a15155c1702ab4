"""conf/experiment: every recipe composes, every sweep point composes and means what its name says, and the small
experiments run end to end on CPU (tiny sizes, a few steps), one of them through `train.py -m` as a user types it."""
from __future__ import annotations

import itertools
import os
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from longctx.models import build_model
from longctx.train.config import validate
from longctx.train.trainer import Trainer, model_spec

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
RECIPES = ("paper", "icl_small", "paper_scale")  # bases the sweeps start from (no sweep of their own)
SWEEPS = [e for e in EXPERIMENTS if e not in RECIPES]
SMALL = [e for e in SWEEPS if not e.endswith("_paper")]
# Tiny sizes for CPU: any point of a small sweep trains for 2 steps in seconds.
TINY = ["trainer.max_steps=2", "trainer.eval_every=2", "logger.wandb.mode=disabled", "trainer.num_threads=2",
        "data.doc_len=128", "data.train_tokens=4096", "data.n_heldout=8", "data.eval_docs=4",
        "data.docs_per_batch=4", "ctx=64", "model.d_model=64", "model.n_heads=1", "model.n_layers=1",
        "device=cpu", "optim.warmup_steps=1"]


def sweep_points(compose, name: str) -> list[list[str]]:
    """The overrides of every job of `train.py -m experiment=<name>` (the cartesian product of its sweep)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    axes = [[f"{k}={v.strip()}" for v in str(vals).split(",")] for k, vals in params.items()]
    return [list(p) for p in itertools.product(*axes)]


def test_at_least_six_experiments_each_small_and_paper_scale():
    assert len(SWEEPS) >= 12
    for name in SMALL:
        assert f"{name}_paper" in SWEEPS, f"{name} has no paper-scale config"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(compose, name):
    cfg = compose(f"experiment={name}", "run_dir=unused")
    OmegaConf.to_container(cfg, resolve=True)
    validate(cfg)


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_point_composes_grouped_in_wandb(compose, name):
    points = sweep_points(compose, name)
    assert len(points) >= 2
    names = set()
    for point in points:
        cfg = compose(f"experiment={name}", "run_dir=unused", *point)
        OmegaConf.to_container(cfg, resolve=True)
        validate(cfg)
        assert cfg.logger.wandb.group == name
        names.add(cfg.run_name)
    assert len(names) == len(points), "two points of one sweep would share a run name"


def _state(cfg) -> int:
    import torch
    with torch.device("meta"):
        return build_model(model_spec(cfg, 65)).state_size(cfg.ctx)


def test_equal_state_arms_mean_what_they_say(compose):
    """The window arm holds power p=2's state; window_linear_state holds linear attention's (within 1%)."""
    base = ("experiment=attention_equal_state", "run_dir=unused")
    power = _state(compose(*base, "+experiment/arm=power_p2"))
    window = _state(compose(*base, "+experiment/arm=window"))
    assert abs(window - power) / power < 0.01
    linear = _state(compose(*base, "+experiment/arm=linear"))
    window_lin = _state(compose(*base, "+experiment/arm=window_linear_state"))
    assert abs(window_lin - linear) / linear < 0.01
    # the table's softmax row at ctx 1024 keeps a KV cache within 15% of power p=2's state
    exp = compose("experiment=best_context_table", "run_dir=unused", "+experiment/table=exp")
    assert exp.ctx == 1024 and abs(_state(exp) - power) / power < 0.15


@pytest.mark.parametrize("name", ["context_scaling", "context_scaling_paper", "reshape_ablation",
                                  "best_context_table"])
def test_context_points_keep_tokens_per_update(compose, name):
    tokens = {compose(f"experiment={name}", "run_dir=unused", *point).data.docs_per_batch
              * compose(f"experiment={name}", "run_dir=unused", *point).ctx for point in sweep_points(compose, name)}
    assert len(tokens) == 1, tokens


@pytest.mark.parametrize("name", SMALL)
def test_small_experiment_trains_on_cpu(compose, tmp_path, name):
    point = [o.replace("reshape_block=512", "reshape_block=32") for o in sweep_points(compose, name)[-1]]
    cfg = compose(f"experiment={name}", f"run_dir={tmp_path / 'run'}", *point, *TINY)
    record = Trainer(cfg).fit()
    assert record["step"] == 2 and record["best_context_loss"] > 0
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["best_context_loss"] == record["best_context_loss"]


def test_one_command_sweep_runs_every_point(train_env, tmp_path):
    """`train.py -m experiment=best_context_table` as typed (tiny sizes): one run directory per row, with the
    row's own context (1024 for softmax, 4096 for window and power)."""
    sizes = [o for o in TINY if not o.startswith(("ctx=", "data.doc_len="))] + ["data.doc_len=4096",
                                                                                 "data.train_tokens=16384"]
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "-m", "experiment=best_context_table",
                          f"hydra.sweep.dir={tmp_path}", *sizes], env=train_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p for p in tmp_path.iterdir() if (p / "metrics.jsonl").exists())
    assert len(runs) == 3
    ctxs = {OmegaConf.load(r / "config.yaml").attention.name: OmegaConf.load(r / "config.yaml").ctx for r in runs}
    assert ctxs == {"exp": 1024, "window": 4096, "power": 4096}


def test_sweep_launcher_prints_the_command(tmp_path):
    script = REPO / "scripts" / "slurm" / "sweep_experiment.sh"
    out = subprocess.run([str(script), "context_scaling", "--launcher", "slurm", "--dry-run", "seed=1"], cwd=REPO,
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PARTITION": "gpu"})
    assert out.returncode == 0, out.stderr
    assert "train.py -m experiment=context_scaling hydra/launcher=submitit_slurm" in out.stdout
    assert "hydra.launcher.partition=gpu" in out.stdout and out.stdout.strip().endswith("seed=1")
    bad = subprocess.run([str(script), "no_such_experiment"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "no conf/experiment/no_such_experiment.yaml" in bad.stderr


def test_curriculum_script_trains_both_stages_and_a_relaunch_does_nothing(train_env, tmp_path):
    """scripts/icl_curriculum.sh (tiny sizes): with STAGE0_STEPS, stage 0 at ctx 256, stage 1 at ctx 1024 from its
    weights, stage 2 at ctx 4096 from stage 1's; run again, every stage says it is complete and nothing is
    retrained."""
    sizes = [o for o in TINY if not o.startswith(("ctx=", "data.doc_len=", "data.train_tokens=", "trainer.max_steps",
                                                  "trainer.eval_every"))]
    env = dict(train_env, PYTHON=sys.executable, STAGE0_STEPS="1", STAGE1_STEPS="2", STAGE2_STEPS="2")
    cmd = [str(REPO / "scripts" / "icl_curriculum.sh"), str(tmp_path / "exp"), "attention=exp",
           "data.train_tokens=16384", *sizes]
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    stages = [tmp_path / "exp" / name for name in ("stage0_ctx256", "stage1_ctx1024", "stage2_ctx4096")]
    cfgs = [OmegaConf.load(s / "config.yaml") for s in stages]
    assert [c.ctx for c in cfgs] == [256, 1024, 4096]
    assert [c.trainer.init_from for c in cfgs] == [None, str(stages[0]), str(stages[1])]
    finals = [json.loads((s / "metrics.jsonl").read_text().splitlines()[-1]) for s in stages]
    assert [f["step"] for f in finals] == [1, 2, 2] and finals[2]["tokens"] == 2 * 4 * 4096
    again = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (again.stdout + again.stderr).count("is complete") == 3
    assert len((stages[2] / "metrics.jsonl").read_text().splitlines()) == 1


def test_curriculum_script_without_an_output_folder_says_so(tmp_path):
    script = str(REPO / "scripts" / "icl_curriculum.sh")
    bad = subprocess.run([script, "attention=exp"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "the first argument is the output folder (got 'attention=exp')" in bad.stderr
    assert not any(tmp_path.iterdir())  # nothing written
    assert subprocess.run([script, "--help"], capture_output=True, text=True).stdout.startswith("The calibrated")


@pytest.mark.parametrize("whole", ["0", "1"])
def test_curriculum_whole_docs_sets_each_short_stage_document_length(tmp_path, whole):
    """WHOLE_DOCS=1: stage 0 reads 256-token and stage 1 1024-token documents, stage 2 the task's own; without it,
    no stage overrides the document length (PYTHON=echo prints the three train.py commands)."""
    env = dict(os.environ, PYTHON="echo", STAGE0_STEPS="1", WHOLE_DOCS=whole)
    out = subprocess.run([str(REPO / "scripts" / "icl_curriculum.sh"), str(tmp_path / "x"), "attention=exp"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3
    doc_lens = [[w for w in line.split() if w.startswith("data.doc_len=")] for line in lines]
    want = [["data.doc_len=256"], ["data.doc_len=1024"], []] if whole == "1" else [[], [], []]
    assert doc_lens == want
