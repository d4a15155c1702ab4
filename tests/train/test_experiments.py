"""conf/experiment and staged training: every recipe composes, every sweep point composes and means what its name
says, every small sweep runs the calibrated staged recipe, and each small experiment runs end to end on CPU
through `train.py -m experiment=NAME +experiment/scale=cpu_tiny` (every point, every stage; a relaunch trains
nothing again)."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from longctx.data import dataset_info
from longctx.models import build_model
from longctx.train.config import validate
from longctx.train.stages import INDEX, StagedRun, final_stage_dir, plan
from longctx.train.trainer import model_spec

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
# bases the sweeps start from (no sweep of their own)
RECIPES = ("paper", "icl_small", "paper_scale", "icl_curriculum", "icl_token_shift",
           "convert_continue")  # a pretrained Hugging Face model continued at a longer context
SWEEPS = [e for e in EXPERIMENTS if e not in RECIPES]
# sweeps on a corpus the user prepares (real text): no ICL task, no staged recipe, no paper-scale twin
REAL_TEXT = ("corpus_attention",)
# recall sweeps (data=mqar): one stage at their own context, no ICL recipe, no paper-scale twin (the paper has none)
RECALL = ("recall_state", "recall_state_long", "recall_state_widths", "recall_state_cpu")
SMALL = [e for e in SWEEPS if not e.endswith("_paper") and e not in REAL_TEXT + RECALL]
# each small sweep's paper-scale counterpart
PAPER_OF = {"attention_long_context": "attention_equal_state_paper"}
# points of each small sweep (one seed)
POINTS = {"attention_equal_state": 7, "best_context_table": 3, "attention_long_context": 4, "flops_frontier": 6,
          "context_scaling": 12, "reshape_ablation": 6, "icl_vs_batch": 3, "icl_vs_params": 3}
CPU_TINY = "+experiment/scale=cpu_tiny"


def sweep_points(name: str, *extra: str) -> list[list[str]]:
    """The overrides of every job of `train.py -m experiment=<name>` (the cartesian product of its sweep)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=[f"experiment={name}", *extra], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    axes = [[f"{k}={v.strip()}" for v in str(vals).split(",")] for k, vals in params.items()]
    return [list(p) for p in itertools.product(*axes)]


def _state(cfg) -> int:
    import torch
    with torch.device("meta"):
        return build_model(model_spec(cfg, 65)).state_size(cfg.ctx)


# ----- composition ------------------------------------------------------------------------------------------
def test_every_small_experiment_has_a_paper_scale_one():
    assert len(SWEEPS) >= 12 and set(POINTS) == set(SMALL)
    for name in SMALL:
        assert PAPER_OF.get(name, f"{name}_paper") in SWEEPS, f"{name} has no paper-scale config"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(compose, name):
    cfg = compose(f"experiment={name}", "run_dir=unused")
    OmegaConf.to_container(cfg, resolve=True)
    validate(cfg)
    if cfg.trainer.stages:
        plan(cfg)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_starts_with_its_claim_and_command(name):
    """The header comment: the setting, the run command; a sweep also the time per point."""
    head = [line for line in (REPO / "conf" / "experiment" / f"{name}.yaml").read_text().splitlines()[1:]
            if line.startswith("#")]
    text = "\n".join(head)
    assert "python train.py" in text and f"experiment={name}" in text
    if name in SMALL:
        assert "H200" in text and "min" in text, "a small sweep states its time per point"


def _check_staged_recipe(cfg) -> None:
    """A small sweep's point: the token shift on, a first stage of 400 updates at ctx 1024 x 512 documents (524,288
    tokens), the last stage the point's own config, each later stage from the previous stage's weights."""
    assert cfg.arch.token_shift is True
    stages = plan(cfg, check=False)
    assert len(stages) >= 2
    first, last = stages[0][1], stages[-1][1]
    assert (first.ctx, first.data.docs_per_batch, first.trainer.max_steps) == (1024, 512, 400)
    assert first.trainer.init_from is None
    assert (last.ctx, last.data.docs_per_batch, last.trainer.max_steps) == (cfg.ctx, cfg.data.docs_per_batch,
                                                                           cfg.trainer.max_steps)
    assert [s.trainer.init_from for _, s in stages[1:]] == [str(folder) for folder, _ in stages[:-1]]
    assert [folder.name for folder, _ in stages] == [f"stage{i + 1}_ctx{s.ctx}" for i, (_, s) in enumerate(stages)]
    assert all(s.trainer.stages is None and s.arch.token_shift for _, s in stages)


@pytest.mark.slow  # ~5 s a sweep; test_cpu_tiny_keeps_every_point_distinct_and_small composes every small point
@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_point_composes_grouped_in_wandb(compose, name):
    """Every point composes and validates, in the experiment's wandb group, under a name of its own; a small
    sweep's point runs the calibrated staged recipe."""
    points = sweep_points(name)
    assert len(points) >= 2
    if name in POINTS:
        assert len(points) == POINTS[name]
    names = set()
    for point in points:
        cfg = compose(f"experiment={name}", "run_dir=/r", *point)
        OmegaConf.to_container(cfg, resolve=True)
        validate(cfg)
        assert cfg.logger.wandb.group == name
        names.add(cfg.run_name)
        if name in SMALL:
            _check_staged_recipe(cfg)
    assert len(names) == len(points), "two points of one sweep would share a run name"


def test_a_seed_axis_triples_any_sweep(compose):
    points = [[*p, f"seed={seed}"] for p in sweep_points("best_context_table") for seed in (0, 1, 2)]
    names = {compose("experiment=best_context_table", "run_dir=unused", *p).run_name for p in points}
    assert len(names) == 9


def test_the_recipe_is_the_calibrated_one(compose):
    cfg = compose("experiment=icl_curriculum", "run_dir=/r")
    assert cfg.arch.token_shift is False  # the block the recipe was calibrated in; the sweeps turn the shift on
    (dir1, s1), (dir2, s2) = plan(cfg)
    assert (dir1.name, dir2.name) == ("stage1_ctx1024", "stage2_ctx4096")
    assert [(s.ctx, s.data.docs_per_batch, s.trainer.max_steps) for s in (s1, s2)] == [(1024, 512, 400),
                                                                                      (4096, 128, 1500)]
    assert s1.data.train_tokens == s2.data.train_tokens == 67108864 and s2.trainer.eval_every == 100


def _paper_state(cfg) -> int:
    """One layer's state by the paper's definitions (longctx.state), at the config's context."""
    from longctx.state import state_per_layer

    return state_per_layer(cfg.attention.name, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, ctx=cfg.ctx,
                           p=cfg.p, window=cfg.attention.get("window"))


def test_equal_state_arms_mean_what_they_say(compose):
    """The window arm holds power p=2's state by the paper's definition (D = C(65, 2): w = 1040), the
    window_tiled_state arm the state the kernels store (the models' own count, w = 1170), window_linear_state
    linear attention's; each within 1%."""
    base = ("experiment=attention_equal_state", "run_dir=unused")
    power_cfg, window_cfg, tiled_cfg = (compose(*base, f"+experiment/arm={arm}")
                                        for arm in ("power_p2", "window", "window_tiled_state"))
    assert (window_cfg.window, tiled_cfg.window) == (1040, 1170)
    assert abs(_paper_state(window_cfg) - _paper_state(power_cfg)) / _paper_state(power_cfg) < 0.01
    power = _state(power_cfg)
    assert abs(_state(tiled_cfg) - power) / power < 0.01
    linear = _state(compose(*base, "+experiment/arm=linear"))
    window_lin = _state(compose(*base, "+experiment/arm=window_linear_state"))
    assert abs(window_lin - linear) / linear < 0.01
    # the table's softmax row at ctx 1024 keeps a KV cache within 2% of power p=2's state (the paper's definition)
    exp = compose("experiment=best_context_table", "run_dir=unused", "+experiment/table=exp")
    assert exp.ctx == 1024 and abs(_paper_state(exp) - _paper_state(power_cfg)) / _paper_state(power_cfg) < 0.02
    arms = {p[0] for p in sweep_points("attention_equal_state")}
    assert {"+experiment/arm=window_linear_state", "+experiment/arm=window_tiled_state",
            "+experiment/arm=power_p4"} <= arms


def test_corpus_attention_arms_hold_equal_state_and_tokens_per_update(compose):
    """Real text: softmax, a window with power p=2's state, power p=2 at ctx 8192 (GPT-2 small); the 64k point
    keeps 65,536 tokens per update and the updates."""
    base = ("experiment=corpus_attention", "run_dir=unused")
    assert sorted(p[0] for p in sweep_points("corpus_attention")) == [
        "+experiment/arm=exp", "+experiment/arm=power_p2", "+experiment/arm=window"]
    power, window = (compose(*base, f"+experiment/arm={arm}") for arm in ("power_p2", "window"))
    assert (power.model.name, power.ctx, power.data.name, power.data.tag) == ("small", 8192, "longcrawl64",
                                                                              "source_corpus")
    assert abs(_paper_state(window) - _paper_state(power)) / _paper_state(power) < 0.01 and window.window < window.ctx
    long = compose(*base, "+experiment/arm=power_p2", "+experiment/ctx=c65536")
    assert long.ctx * long.data.docs_per_batch == power.ctx * power.data.docs_per_batch == 65536
    assert long.trainer.max_steps == power.trainer.max_steps


def test_table_rows_at_the_papers_contexts_and_equal_tokens(compose):
    rows = {compose("experiment=best_context_table", "run_dir=u", *p).attention.name:
            compose("experiment=best_context_table", "run_dir=u", *p) for p in sweep_points("best_context_table")}
    assert {k: v.ctx for k, v in rows.items()} == {"exp": 1024, "window": 4096, "power": 4096}
    assert {v.ctx * v.data.docs_per_batch for v in rows.values()} == {524288}


def test_long_context_comparison_limits_the_window_and_runs_the_chunked_form(compose):
    """ctx >= 16384 (power p=2's chunked form on CUDA), stacked windows reaching less than the context."""
    from longctx.kernels.power.plan import cuda_chunk_size
    import torch
    for name in ("attention_long_context", "flops_frontier"):
        for point in sweep_points(name):
            cfg = compose(f"experiment={name}", "run_dir=u", *point)
            assert cfg.ctx >= 16384 and cfg.data.doc_len >= cfg.ctx
            if cfg.attention.name == "window":
                assert cfg.model.n_layers * cfg.window < cfg.ctx
            if cfg.attention.name == "power":
                assert cuda_chunk_size(cfg.ctx, 2, 64, torch.bfloat16) is not None


def test_long16k_task_optimum_still_falls_at_16k():
    """data=icl_markov_long16k, exact optimum (48 documents): the last bin of the Bayes curve >= 0.1 nats below the
    bin holding ctx/8 and below the bin holding position 4096 (so a window's limited reach costs)."""
    from longctx.data.icl_markov import (bayes_nll_mixture, on_size_ranges, sample_mixture_chains,
                                         sample_mixture_matrices)
    from longctx.train.metrics import bin_curve, exponential_bins
    conf = REPO / "conf" / "data"
    cfg = OmegaConf.merge(OmegaConf.load(conf / "icl_markov_long.yaml"),
                          OmegaConf.load(conf / "icl_markov_long16k.yaml"))
    counts, ctx = sorted(cfg.state_counts), cfg.doc_len
    assert ctx == 16384 and max(counts) == cfg.vocab
    rng = np.random.default_rng(6)
    sizes, P = sample_mixture_matrices(rng, 48, counts, cfg.alpha)
    x = on_size_ranges(sample_mixture_chains(rng, P, ctx, sizes), sizes, counts, False)
    bins = exponential_bins(ctx, 16)
    binned = bin_curve(bayes_nll_mixture(x, counts, cfg.alpha).mean(0), bins)
    at = [next(i for i, (a, b) in enumerate(bins) if a <= pos < b) for pos in (ctx // 8, 4096)]
    assert binned[at[0]] - binned[-1] >= 0.1 and binned[at[1]] - binned[-1] >= 0.1, binned


def test_flops_frontier_schedules_only_the_last_stage_to_its_budget(compose):
    budgets = set()
    for point in sweep_points("flops_frontier"):
        cfg = compose("experiment=flops_frontier", "run_dir=u", *point)
        stages = [s for _, s in plan(cfg, check=False)]
        assert all(s.trainer.flops_budget is None for s in stages[:-1])
        assert stages[-1].trainer.flops_budget == cfg.trainer.flops_budget is not None
        budgets.add(cfg.trainer.flops_budget)
    assert len(budgets) >= 2


def test_context_scaling_holds_documents_or_tokens(compose):
    """hold=docs: the same documents per update at every context (the paper's Fig. 1); hold=tokens: the same tokens
    per update (the reshape control)."""
    by_hold = {}
    for point in sweep_points("context_scaling"):
        cfg = compose("experiment=context_scaling", "run_dir=u", *point)
        hold = dict(o.split("=") for o in point)["+experiment/hold"]
        by_hold.setdefault(hold, []).append(cfg)
    assert {c.ctx for c in by_hold["docs"]} == {1024, 4096, 16384}
    assert len({c.data.docs_per_batch for c in by_hold["docs"]}) == 1
    assert len({c.data.docs_per_batch * c.ctx for c in by_hold["tokens"]}) == 1
    assert all(c.data.doc_len >= 16384 for cs in by_hold.values() for c in cs)


@pytest.mark.parametrize("name", ["context_scaling_paper", "reshape_ablation"])
def test_context_points_keep_tokens_per_update(compose, name):
    cfgs = [compose(f"experiment={name}", "run_dir=unused", *point) for point in sweep_points(name)]
    assert len({c.data.docs_per_batch * c.ctx for c in cfgs}) == 1


def test_cpu_tiny_keeps_every_point_distinct_and_small(compose):
    for name in SMALL:
        points = sweep_points(name, CPU_TINY)
        cfgs = [compose(f"experiment={name}", "run_dir=/r", *p, CPU_TINY) for p in points]
        assert len({c.run_name for c in cfgs}) == len(points), name
        for cfg in cfgs:
            for _, stage in plan(cfg, check=False):
                assert stage.ctx <= 256 and stage.trainer.max_steps <= 2 and stage.device == "cpu"


# ----- stages: bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("stages,match", [
    ("[{ctx:128,data.docs_per_bach:4},{}]", r"trainer.stages\[0\].data.docs_per_bach=4: unknown key"),
    ("[{ctx:128},{model.d_model:32}]", r"trainer.stages\[1\].model.d_model=32: .*cannot change the model"),
    ("[{p:4},{}]", r"trainer.stages\[0\].p=4: .*cannot change the model"),
    ("[{trainer.init_from:'/x'},{}]", r"trainer.stages\[0\].trainer.init_from='/x': set by the stages"),
    ("[{ctx:-3},{}]", r"trainer.stages\[0\]: config: ctx=-3: must be a positive integer"),
    ("[]", r"trainer.stages=\[\]: must be a non-empty list"),
    ("[3,{}]", r"trainer.stages\[0\]=3: must be a dict"),
    ("[{data.vocab:100},{}]", r"trainer.stages\[1\]: its data has 5 tokens in its vocabulary, stage 0's 101"),
])
def test_bad_stages_name_the_stage_and_key(compose, tmp_path, stages, match):
    cfg = compose(f"run_dir={tmp_path / 'run'}", f"trainer.stages={stages}")
    with pytest.raises(ValueError, match=match):
        StagedRun(cfg)
    assert not (tmp_path / "run").exists()  # nothing written


def test_bad_stage_from_the_command_line_exits_2_writing_nothing(train_env, tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "train.py"), f"hydra.run.dir={tmp_path / 'run'}",
                          "trainer.stages=[{ctx:32,trainer.max_stepz:1},{}]", "logger.wandb.mode=disabled"],
                         env=train_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("error: config: trainer.stages[0].trainer.max_stepz=1")
    assert not (tmp_path / "run").exists()


# ----- stages: training -------------------------------------------------------------------------------------
def _tiny_staged(compose, run_dir: Path, *extra: str):
    return compose(f"run_dir={run_dir}", "ctx=64", "data.docs_per_batch=4", "data.train_tokens=65536",
                   "data.n_heldout=8", "data.eval_docs=4", "trainer.max_steps=2", "trainer.eval_every=2",
                   "trainer.num_threads=2", "optim.warmup_steps=1", "logger.wandb.mode=disabled", "device=cpu",
                   "trainer.resume=auto",
                   "trainer.stages=[{ctx:32,data.docs_per_batch:8,trainer.max_steps:1},{}]", *extra)


def _two_stages(compose, run_dir: Path, steps: int, eval_every: int = 2):
    """A run of two stages (ctx 64, then 32), each of `steps` steps, resumed where it can be."""
    return compose(f"run_dir={run_dir}", "ctx=64", "data.docs_per_batch=4", "data.train_tokens=65536",
                   "data.n_heldout=8", "data.eval_docs=4", f"trainer.max_steps={steps}",
                   f"trainer.eval_every={eval_every}", "trainer.num_threads=2", "optim.warmup_steps=1",
                   "logger.wandb.mode=disabled", "device=cpu", "trainer.resume=auto", "trainer.stages=[{},{ctx:32}]")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_resume_true_continues_whichever_stage_was_interrupted(compose, tmp_path):
    """trainer.resume=true on a staged run: the first stage must have a checkpoint (else there is no such run: a
    mistyped folder is refused, not trained afresh), every later stage resumes if it can (auto) or starts."""
    cfg = _tiny_staged(compose, tmp_path / "run", "trainer.resume=true")
    assert [s.trainer.resume for _, s in plan(cfg, check=False)] == [True, "auto"]
    with pytest.raises(FileNotFoundError, match="trainer.resume=true but .*stage1_ctx32 holds no checkpoint"):
        StagedRun(cfg)
    assert not (tmp_path / "run").exists()
    cfg = _tiny_staged(compose, tmp_path / "run", "trainer.resume=false")
    assert [s.trainer.resume for _, s in plan(cfg, check=False)] == [False, False]


def test_staged_run_trains_each_stage_from_the_previous_weights(compose, tmp_path, monkeypatch):
    from longctx.train import checkpoint as ckpt
    from longctx.train import estimate
    from longctx.train.trainer import Trainer
    built, said = [], []
    monkeypatch.setattr(estimate.log, "info", lambda msg, *a, **k: said.append(msg))

    def make_trainer(stage_cfg):
        trainer = Trainer(stage_cfg)
        built.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
        return trainer

    run = tmp_path / "run"
    record = StagedRun(_tiny_staged(compose, run), make_trainer=make_trainer).fit()
    s1, s2 = run / "stage1_ctx32", run / "stage2_ctx64"
    assert json.loads((run / INDEX).read_text())["stages"] == [
        {"dir": "stage1_ctx32", "overrides": {"ctx": 32, "data.docs_per_batch": 8, "trainer.max_steps": 1}},
        {"dir": "stage2_ctx64", "overrides": {}}]
    assert final_stage_dir(run) == s2 and final_stage_dir(s2) is None
    # each stage says its memory estimate once, when it starts (the up-front check of stage 2 only refuses)
    assert sum(msg.startswith("estimate: peak memory") for msg in said) == 2
    assert _metrics(s1)[-1]["step"] == 1 and _metrics(s1)[-1]["tokens"] == 8 * 32
    final = _metrics(s2)[-1]
    assert record["step"] == final["step"] == 2 and record["best_context_loss"] == final["best_context_loss"]
    assert final["tokens"] == 2 * 4 * 64  # the step and token counts start fresh
    # ... and the record carries the weights' whole training: every stage's tokens and FLOPs
    first = _metrics(s1)[-1]
    assert first["tokens_all_stages"] == first["tokens"] and first["flops_all_stages"] == first["flops"]
    assert final["tokens_all_stages"] == first["tokens"] + final["tokens"]
    assert final["flops_all_stages"] == pytest.approx(first["flops"] + final["flops"], rel=1e-12)
    # passes over the training split, and the heldout loss against the training loss
    info = dataset_info(_train_split(s2))
    served = (info["num_docs"] // 4) * 4 * (info["doc_len"] // 64) * 64   # whole batches of whole contexts
    assert final["epochs"] == pytest.approx(final["tokens"] / served, abs=1e-4)
    assert final["heldout_minus_train"] == pytest.approx(final["heldout_loss"] - final["train_loss"])
    assert final["heldout_loss"] == pytest.approx(np.mean(final["per_position_loss"]), abs=1e-4)
    c1, c2 = OmegaConf.load(s1 / "config.yaml"), OmegaConf.load(s2 / "config.yaml")
    assert (c1.ctx, c1.trainer.init_from, c1.trainer.stages) == (32, None, None)
    assert (c2.ctx, c2.trainer.init_from, c2.run_dir) == (64, str(s1), str(s2))
    # stage 2 started from exactly stage 1's last weights, not from a new initialization
    stage1_final = ckpt.load_checkpoint(ckpt.latest_checkpoint(s1)[1])["model"]
    assert all((built[1][k] == v).all() for k, v in stage1_final.items())
    assert any((built[0][k] != v).any() for k, v in stage1_final.items())


def test_a_later_stage_never_continues_from_weights_its_stage_before_has_trained_past(compose, tmp_path):
    """Both stages ran; a relaunch that would train the first further (a longer trainer.max_steps, which the stages
    index does not hold) is refused before anything trains, and so is a later stage whose records say it started
    from fewer tokens than the stage before now holds: its weights would not follow from that stage's."""
    from longctx.train.stages import StageError

    def staged(steps):
        return _two_stages(compose, tmp_path / "run", steps)
    StagedRun(staged(2)).fit()
    s1, s2 = tmp_path / "run" / "stage1_ctx64", tmp_path / "run" / "stage2_ctx32"
    before = (s2 / "metrics.jsonl").read_text()
    with pytest.raises(StageError, match=r"trainer.stages\[0\] \(stage1_ctx64\) would train further"):
        StagedRun(staged(4))
    lines = (s1 / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    (s1 / "metrics.jsonl").write_text("\n".join(lines + [json.dumps({**last, "step": 4,
                                                                      "tokens_all_stages": 2 * last["tokens"]})]) + "\n")
    with pytest.raises(StageError, match=r"started from stage1_ctx64's weights after 512 tokens, and stage1_ctx64 "
                                         r"has trained to 1,024 since"):
        StagedRun(staged(2))
    assert (s2 / "metrics.jsonl").read_text() == before   # nothing trained


def test_a_later_stage_stopped_before_its_first_checkpoint_starts_over_from_the_longer_stage(compose, tmp_path):
    """A later stage whose launch stopped before its first checkpoint holds nothing to continue: a relaunch that trains
    the stage before further is not refused over that stage's records; the stage starts over from the new weights."""
    def staged(steps):
        return _two_stages(compose, tmp_path / "run", steps)
    StagedRun(staged(2)).fit()
    s1, s2 = tmp_path / "run" / "stage1_ctx64", tmp_path / "run" / "stage2_ctx32"
    shutil.rmtree(s2 / "checkpoints")                  # its launch killed after its evaluation, before the checkpoint
    StagedRun(staged(4)).fit()
    first, second = (json.loads((s / "metrics.jsonl").read_text().splitlines()[i]) for s, i in ((s1, -1), (s2, 0)))
    assert first["step"] == 4 and (s2 / "metrics.before_restart.jsonl").exists()
    assert second["tokens_all_stages"] - second["tokens"] == first["tokens_all_stages"]   # from the longer stage


@pytest.mark.parametrize("left", ["weights", "evaluations"])
def test_a_later_stage_its_trainer_would_refuse_still_stops_the_run_before_anything_trains(compose, tmp_path, left):
    """A later stage without a .pt checkpoint that its trainer refuses (weights kept, or two evaluations: its
    checkpoints removed) is not taken for one that starts over: the first stage does not train further."""
    from longctx.train.stages import StageError

    def staged(steps):
        return _two_stages(compose, tmp_path / "run", steps, eval_every=1)
    StagedRun(staged(2)).fit()
    s1, s2 = tmp_path / "run" / "stage1_ctx64", tmp_path / "run" / "stage2_ctx32"
    for path in (s2 / "checkpoints").iterdir():
        if left == "evaluations" or path.suffix == ".pt":
            path.unlink()
    before = (s1 / "metrics.jsonl").read_bytes()
    with pytest.raises(StageError, match=r"trainer.stages\[0\] \(stage1_ctx64\) would train further"):
        StagedRun(staged(4))
    assert (s1 / "metrics.jsonl").read_bytes() == before


def test_a_first_stage_stopped_with_a_malformed_line_starts_over_in_a_staged_run(compose, tmp_path):
    """The first stage's launch stopped before its checkpoint, leaving a malformed metrics line; the later stage
    never started: nothing is stale, the stage's own trainer starts it over (its lines set aside unread)."""
    cfg = _tiny_staged(compose, tmp_path / "run")
    first = plan(cfg)[0][0]
    first.mkdir(parents=True)
    (first / "config.yaml").write_text("stopped: true\n")
    (first / "metrics.jsonl").write_text('{"step": 1, "tokens": 256}\n{"step": 2\n["not a record"]\n')
    staged = StagedRun(cfg)
    assert staged.first.restart and staged.first.step == 0


def test_the_checks_before_a_staged_run_trains_read_each_stages_records_once(compose, tmp_path, monkeypatch):
    """Whether each later stage still follows from the stage before, and whether the first stage would train past a
    later one's start, are judged from the stages' metrics.jsonl, each read once (here: the first stage would)."""
    from types import SimpleNamespace

    from longctx.train import loggers
    from longctx.train.stages import StageError

    cfg = _tiny_staged(compose, tmp_path / "run", "trainer.stages=[{ctx:32,trainer.max_steps:1},"
                                                  "{ctx:32,trainer.max_steps:1},{}]")
    tokens = {"stage1_ctx32": (256, 256), "stage2_ctx32": (256, 512), "stage3_ctx64": (512, 1024)}  # in sequence
    for name, (mine, all_stages) in tokens.items():
        (tmp_path / "run" / name / "checkpoints").mkdir(parents=True)   # each stage ran to a checkpoint
        (tmp_path / "run" / name / "checkpoints" / "step_00000001.pt").write_bytes(b"")
        (tmp_path / "run" / name / "metrics.jsonl").write_text(
            json.dumps({"step": 1, "tokens": mine, "tokens_all_stages": all_stages}) + "\n")
    reads, records = {}, loggers.JsonlLogger.records

    def counted(self):
        reads[self.path.parent.name] = reads.get(self.path.parent.name, 0) + 1
        return records(self)

    monkeypatch.setattr(loggers.JsonlLogger, "records", counted)
    unfinished = SimpleNamespace(complete=False, close=lambda: None)
    with pytest.raises(StageError, match=r"trainer.stages\[0\] \(stage1_ctx32\) would train further"):
        StagedRun(cfg, make_trainer=lambda stage_cfg: unfinished)
    assert reads == {name: 1 for name in tokens}


def test_epochs_count_the_tokens_a_pass_serves(compose, tmp_path):
    """Where ctx does not divide the documents' length the reader leaves each document's tail out: a pass is the
    whole contexts of whole batches, and `epochs` counts passes of those (the data repeats at 1, not later)."""
    from longctx.train.trainer import Trainer

    cfg = compose(f"run_dir={tmp_path / 'run'}", "ctx=96", "data.docs_per_batch=4", "data.train_tokens=65536",
                  "data.n_heldout=8", "data.eval_docs=4", "trainer.max_steps=2", "trainer.eval_every=2",
                  "trainer.num_threads=2", "optim.warmup_steps=1", "logger.wandb.mode=disabled", "device=cpu")
    Trainer(cfg).fit()
    info = dataset_info(_train_split(tmp_path / "run"))
    assert info["doc_len"] % 96 != 0
    final = _metrics(tmp_path / "run")[-1]
    served = (info["num_docs"] // 4) * 4 * (info["doc_len"] // 96) * 96
    assert final["tokens"] == 2 * 4 * 96 and final["epochs"] == pytest.approx(final["tokens"] / served, abs=1e-4)
    assert served < info["num_docs"] * info["doc_len"]


def _train_split(run: Path) -> Path:
    """The training split a run read (its recorded data identity)."""
    return Path(json.loads((run / "data_identity.json").read_text())["train"]["path"])


def test_relaunch_resumes_the_interrupted_stage_and_refuses_other_stages(compose, tmp_path):
    from longctx.train import checkpoint as ckpt
    run = tmp_path / "run"
    cfg = _tiny_staged(compose, run, "trainer.max_steps=4")
    StagedRun(cfg).fit()
    stage1 = (run / "stage1_ctx32" / "metrics.jsonl").read_text()
    # as if killed in stage 2 between its checkpoints at steps 2 and 4: drop what step 4 wrote
    stage2 = run / "stage2_ctx64"
    ckpt.latest_checkpoint(stage2)[1].unlink()
    kept = [line for line in (stage2 / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 2]
    (stage2 / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    record = StagedRun(_tiny_staged(compose, run, "trainer.max_steps=4")).fit()
    assert record["step"] == 4 and (run / "stage1_ctx32" / "metrics.jsonl").read_text() == stage1
    assert [r["step"] for r in _metrics(stage2)] == [2, 4]
    # the same run with other stages is refused before anything trains
    other = _tiny_staged(compose, run, "trainer.max_steps=4",
                         "trainer.stages=[{ctx:32,data.docs_per_batch:8,trainer.max_steps:3},{}]")
    with pytest.raises(ValueError, match=r"trainer.stages: .* was trained with other stages"):
        StagedRun(other)


def test_curriculum_script_is_the_recipe(tmp_path):
    """PYTHON=echo prints the one train.py command the wrapper runs."""
    def cmd(**env):
        out = subprocess.run([str(REPO / "scripts" / "icl_curriculum.sh"), str(tmp_path / "x"), "attention=exp"],
                             env=dict(os.environ, PYTHON="echo", **env), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    words = cmd()
    assert words[:3] == ["train.py", "experiment=icl_curriculum", "trainer.resume=auto"]
    assert f"hydra.run.dir={tmp_path / 'x'}" in words and "short_stage_steps=400" in words
    assert words[-1] == "attention=exp" and not any(w.startswith("trainer.stages=") for w in words)
    words = cmd(STAGE0_STEPS="3", STAGE1_STEPS="7", STAGE2_STEPS="9", WHOLE_DOCS="1")
    assert "trainer.max_steps=9" in words
    assert ("trainer.stages=[{ctx:256,data.docs_per_batch:2048,trainer.max_steps:3,data.doc_len:256},"
            "{ctx:1024,data.docs_per_batch:512,trainer.max_steps:7,data.doc_len:1024},{}]") in words


def test_curriculum_script_without_an_output_folder_says_so(tmp_path):
    script = str(REPO / "scripts" / "icl_curriculum.sh")
    bad = subprocess.run([script, "attention=exp"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "the first argument is the output folder (got 'attention=exp')" in bad.stderr
    assert not any(tmp_path.iterdir())  # nothing written
    assert subprocess.run([script, "--help"], capture_output=True, text=True).stdout.startswith("The calibrated")


def test_curriculum_script_trains_both_stages_and_a_relaunch_does_nothing(train_env, tmp_path):
    """scripts/icl_curriculum.sh (tiny sizes through the CPU scale): stage 1 at the short context, stage 2 at the
    full one from its weights; run again, both stages say they are complete and nothing is retrained."""
    env = dict(train_env, PYTHON=sys.executable, STAGE1_STEPS="1", STAGE2_STEPS="2")
    cmd = [str(REPO / "scripts" / "icl_curriculum.sh"), str(tmp_path / "exp"), "attention=exp", CPU_TINY]
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    stages = [tmp_path / "exp" / name for name in ("stage1_ctx32", "stage2_ctx128")]
    assert [_metrics(s)[-1]["step"] for s in stages] == [1, 2]
    assert OmegaConf.load(stages[1] / "config.yaml").trainer.init_from == str(stages[0])
    again = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (again.stdout + again.stderr).count("is complete") == 2
    assert len(_metrics(stages[1])) == 1


# ----- every small experiment through the real entry point, CPU size ----------------------------------------
def _sweep(name: str, sweep_dir: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "train.py"), "-m", f"experiment={name}", CPU_TINY,
                           f"hydra.sweep.dir={sweep_dir}"], env=env, cwd=sweep_dir.parent, capture_output=True,
                          text=True, timeout=1200)


SLOW = {"attention_equal_state", "context_scaling", "reshape_ablation", "flops_frontier", "attention_long_context",
        "icl_vs_batch", "icl_vs_params"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in SMALL])
def test_small_experiment_runs_every_stage_of_every_point_on_cpu(train_env, tmp_path, name):
    """`train.py -m experiment=NAME +experiment/scale=cpu_tiny`: one run folder per point, each with every stage's
    folder and final metrics (the last stage's, at the point's own context); run again, nothing trains."""
    sweep_dir = tmp_path / "sweep"
    out = _sweep(name, sweep_dir, train_env)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in sweep_dir.glob(f"*/{INDEX}"))
    assert len(runs) == POINTS[name]
    n_stages = 0
    for run in runs:
        stages = [run / s["dir"] for s in json.loads((run / INDEX).read_text())["stages"]]
        assert sorted(p for p in run.iterdir() if p.is_dir()) == sorted(stages)
        n_stages += len(stages)
        for stage in stages:
            cfg = OmegaConf.load(stage / "config.yaml")
            final = _metrics(stage)[-1]
            assert final["step"] == cfg.trainer.max_steps and final["best_context_loss"] > 0
        assert final_stage_dir(run) == stages[-1]
    before = {p: p.read_text() for p in sweep_dir.glob("*/*/metrics.jsonl")}
    again = _sweep(name, sweep_dir, train_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (again.stdout + again.stderr).count("is complete") == n_stages
    assert {p: p.read_text() for p in sweep_dir.glob("*/*/metrics.jsonl")} == before


@pytest.mark.gpu
@pytest.mark.parametrize("arm", ["power_p2", "exp", "window"])
def test_long_context_point_runs_its_three_stages_on_gpu(train_env, tmp_path, arm):
    """One point of attention_long_context on CUDA, its last stage at ctx 8192 (power p=2's chunked form), a few
    updates a stage: three stage folders, the last at ctx 8192, bf16, from the second stage's weights."""
    env = {k: v for k, v in train_env.items()}
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=attention_long_context",
                          f"+experiment/arm={arm}", CPU_TINY, "device=cuda", "contexts.c16384=8192",
                          "contexts.c4096=2048", "data.doc_len=8192", "data.train_tokens=262144",
                          f"hydra.run.dir={tmp_path / 'run'}"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    stages = [run / s["dir"] for s in json.loads((run / INDEX).read_text())["stages"]]
    assert [s.name for s in stages] == ["stage1_ctx32", "stage2_ctx2048", "stage3_ctx8192"]
    assert all(_metrics(s)[-1]["best_context_loss"] > 0 for s in stages)
    last = OmegaConf.load(stages[-1] / "config.yaml")
    assert last.device == "cuda" and last.trainer.init_from == str(stages[1])


def test_sweep_launcher_prints_the_command(tmp_path):
    script = REPO / "scripts" / "slurm" / "sweep_experiment.sh"
    out = subprocess.run([str(script), "context_scaling", "--launcher", "slurm", "--dry-run", "seed=1"], cwd=REPO,
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PARTITION": "gpu"})
    assert out.returncode == 0, out.stderr
    assert "train.py -m experiment=context_scaling hydra/launcher=submitit_slurm" in out.stdout
    assert "hydra.launcher.partition=gpu" in out.stdout and out.stdout.strip().endswith("seed=1")
    bad = subprocess.run([str(script), "no_such_experiment"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "no conf/experiment/no_such_experiment.yaml" in bad.stderr


# ----- recall against state (data=mqar) ------------------------------------------------------------------------
def test_recall_arms_hold_the_states_longctx_state_gives(compose):
    """The window arm holds power p=2's state and window_linear_state linear's, by the paper's definitions."""
    from longctx.state import state_per_layer

    def state(arm):
        cfg = compose("experiment=recall_state", f"+experiment/arm={arm}", "run_dir=/r")
        h, d = cfg.model.n_heads, cfg.model.d_model
        window = cfg.attention.get("window")
        return state_per_layer(cfg.attention.name, d_model=d, n_heads=h, ctx=cfg.ctx, p=cfg.p, window=window)

    assert abs(state("window") - state("power_p2")) / state("power_p2") < 1e-3
    assert state("window_linear_state") == state("linear")
    assert state("exp") > state("power_p2") > state("linear")
    assert state("power_p4") > state("power_p3") > state("exp")     # at ctx 4096, head_dim 64


def test_recall_sweep_points_are_distinct_and_fit_their_context(compose):
    from longctx.train.stages import plan

    for name in ("recall_state", "recall_state_long", "recall_state_widths"):
        points = sweep_points(name)
        names = set()
        for point in points:
            cfg = compose(f"experiment={name}", "run_dir=/r", *point)
            validate(cfg)
            assert cfg.data.name == "mqar" and cfg.logger.wandb.group == name
            assert 4 * cfg.data.n_pairs <= cfg.ctx and cfg.data.n_pairs <= cfg.data.n_keys
            names.add(cfg.run_name)
            # the first stage: 16 pairs, every key asked once, at ctx 64 (2 x 16 + 2 x 16 tokens); then the point
            (_, first), (_, last) = plan(cfg, check=False)
            assert (first.ctx, first.data.n_pairs, first.data.n_queries) == (64, 16, None)
            # ... until it recalls 99% (at most 4,000 updates, one pass over its 131,072 documents at most); the
            # point's own stage runs all its updates
            assert first.trainer.max_steps == 4000 and first.data.docs_per_batch == 32
            assert first.trainer.stop_when == "recall_accuracy>=0.99" and last.trainer.stop_when is None
            assert first.data.train_tokens >= 4000 * 32 * 64
            assert first.data.n_keys == cfg.data.n_keys
            assert (last.ctx, last.data.n_pairs, last.trainer.max_steps) == (cfg.ctx, cfg.data.n_pairs,
                                                                            cfg.trainer.max_steps)
        assert len(names) == len(points)


def test_recall_widths_grow_every_arms_state_with_the_heads(compose):
    """recall_state_widths: 1-8 heads of 64 at 2 layers, N = 256; each arm's state is its one-head state times the
    heads (longctx.state), and the window still holds power p=2's state at every width."""
    from longctx.state import state_per_layer

    points = sweep_points("recall_state_widths")
    assert len(points) == 16 and {p for point in points for p in point if p.startswith("data.")} == {
        "data.n_pairs=256"}
    states = {}
    for point in points:
        cfg = compose("experiment=recall_state_widths", "run_dir=/r", *point)
        assert (cfg.model.d_model // cfg.model.n_heads, cfg.model.n_layers, cfg.ctx) == (64, 2, 4096)
        states[cfg.attention.tag, cfg.model.n_heads] = state_per_layer(
            cfg.attention.name, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, ctx=cfg.ctx, p=cfg.p,
            window=cfg.attention.get("window"))
    for (tag, heads), state in states.items():
        assert state == heads * states[tag, 1]
    assert {heads for _, heads in states} == {1, 2, 4, 8}
    assert all(states["window1040", h] == states["power_p2", h] for h in (1, 2, 4, 8))
    assert states["linear", 1] == 64 * 64 and states["power_p2", 8] == 8 * 2080 * 64


def test_recall_fixed_first_stage(compose):
    """first_steps=2000 first_stop=null first_tokens=4194304: a fixed first stage (the withdrawn earlier N = 64 run's),
    all 2,000 updates with no stop bound."""
    from longctx.train.stages import plan

    cfg = compose("experiment=recall_state", "+experiment/arm=power_p2", "data.n_pairs=64", "first_steps=2000",
                  "first_stop=null", "first_tokens=4194304", "run_dir=/r")
    (_, first), _ = plan(cfg, check=False)
    assert first.trainer.max_steps == 2000 and first.trainer.stop_when is None
    assert first.data.train_tokens == 4194304


def test_recall_first_stage_with_no_pairs_names_the_field(compose):
    """first_pairs=0 fails when the stages are planned (before anything trains), naming the stage's field."""
    from omegaconf.errors import InterpolationResolutionError

    from longctx.train.stages import plan

    cfg = compose("experiment=recall_state_cpu", "+experiment/arm=exp", "first_pairs=0", "run_dir=/r")
    with pytest.raises(InterpolationResolutionError, match=r"data.n_pairs: must be a positive integer, got 0"):
        plan(cfg, check=False)


def test_recall_sweep_runs_on_cpu_and_logs_recall(train_env, tmp_path):
    """`train.py -m experiment=recall_state_cpu`: every point trains and logs its accuracy at the queries."""
    sweep_dir = tmp_path / "sweep"
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "-m", "experiment=recall_state_cpu",
                          f"hydra.sweep.dir={sweep_dir}", "+experiment/arm=exp,power_p2", "data.n_pairs=4"],
                         cwd=tmp_path, env=train_env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in sweep_dir.glob("*/stage2_ctx64/metrics.jsonl"))
    assert [r.parent.name for r in runs] == ["gpt2_exp_d128l2_mqar_n4_ctx64_s0",
                                             "gpt2_power_p2_d128l2_mqar_n4_ctx64_s0"]
    for run in runs:
        first = _metrics(run.parent / "stage1_ctx16")[-1]   # the first stage: 4 pairs at their dense context
        assert first["recall_queries"] == 4 * 4 and first["step"] == 2
        assert first["tokens_all_stages"] + 2 * 4 * 64 == _metrics(run)[-1]["tokens_all_stages"]
        final = _metrics(run)[-1]
        assert 0 <= final["recall_accuracy"] <= 1 and final["recall_queries"] == 4 * 4
        assert final["recall_chance"] == 1 / 16
        hits = np.load(run / final["doc_bins"])["hits"]
        assert hits.shape == (4, 4) and hits.mean() == pytest.approx(final["recall_accuracy"])
    # the report tables each arm's accuracy (the per-document record's) and pairs the arms on the same queries
    from longctx.report.cli import main as report

    text = report([str(sweep_dir), "--out", str(tmp_path / "report"), "--bootstrap", "50"]).read_text()
    section = text[text.index("## Recall at the queries"):]
    for run in runs:
        accuracy = _metrics(run)[-1]["recall_accuracy"]
        assert f"| {100 * accuracy:.1f}% [" in section
    assert "| exp" in section and "minus run" in section and "6.2% | 16 |" in section
