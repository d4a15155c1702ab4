"""The real entry point and config: composition, validation errors naming their key, runs, resume."""
from __future__ import annotations

import json
import math
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from longctx.train.config import validate
from longctx.eval import min_positions_for
from longctx.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
ICL_ONLY = ("data.train_tokens", "data.n_heldout")


def generic(overrides):
    """The tiny overrides that apply to any data config (drops the ICL generator's sizes)."""
    return [o for o in overrides if not o.startswith(ICL_ONLY)]


def run_cli(args, env, cwd):
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_mission_overrides_compose_as_typed(compose):
    cfg = compose("attention=power", "p=2", "ctx=65536")
    validate(cfg)
    assert cfg.attention.name == "power" and cfg.attention.p == 2 and cfg.ctx == 65536
    assert cfg.run_name == "gpt2_power_p2_d64l3_icl_markov_ctx65536_s0"  # model=tiny: d_model 64, 3 layers
    for name in ("small", "medium", "large"):
        m = compose(f"model={name}").model
        assert (m.d_model, m.n_layers, m.n_heads, m.mlp_ratio) == {
            "small": (768, 12, 12, 4), "medium": (1024, 24, 16, 4), "large": (1280, 36, 20, 4)}[name]
    cfg = compose()
    assert cfg.trainer.max_steps > 0 and cfg.trainer.eval_every > 0 and cfg.logger.wandb.mode == "offline"


def test_unknown_key_is_refused_naming_it(compose):
    with pytest.raises(ConfigCompositionException, match="trainer.max_stepz"):
        compose("trainer.max_stepz=3")


def test_unknown_attention_is_refused_naming_the_group(compose):
    with pytest.raises(ConfigCompositionException, match="attention/softmax"):
        compose("attention=softmax")


@pytest.mark.parametrize("override,key", [
    ("ctx=0", "ctx"), ("p=7", "p"), ("trainer.precision=fp8", "trainer.precision"),
    ("logger.wandb.mode=sometimes", "logger.wandb.mode"), ("model.n_heads=3", "model.d_model"),
    ("trainer.resume=maybe", "trainer.resume"), ("optim.lr=-1", "optim.lr"), ("trainer.eval_every=0", "trainer.eval_every"),
])
def test_bad_values_name_their_key(compose, override, key):
    extra = ["attention=power"] if override.startswith("p=") else []
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate(compose(override, *extra))


def test_ctx_longer_than_documents_is_refused(compose, tiny, tmp_path):
    cfg = compose(*tiny, "data.doc_len=128", "ctx=256", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(ValueError, match=r"ctx=256 is larger than the documents.*doc_len=128"):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_missing_data_path_is_refused(compose, tiny, tmp_path):
    cfg = compose(*generic(tiny), "data=longcrawl64", f"data.path={tmp_path / 'nowhere'}", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(FileNotFoundError, match="data.path"):
        Trainer(cfg)


def test_data_of_wrong_dtype_or_shape_is_refused(compose, tiny, tmp_path):
    import zarr

    root = tmp_path / "bad"
    zarr.open_array(str(root / "train.zarr"), mode="w", shape=(16, 256), dtype="float32", zarr_format=2)[:] = 1.0
    zarr.open_array(str(root / "heldout.zarr"), mode="w", shape=(4, 256), dtype="uint16", zarr_format=2)[:] = 1
    cfg = compose(*generic(tiny), "data=longcrawl64", f"data.path={root}", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(ValueError, match="float32"):
        Trainer(cfg)
    zarr.open_array(str(root / "train.zarr"), mode="w", shape=(16 * 256,), dtype="uint16", zarr_format=2)[:] = 1
    with pytest.raises(ValueError, match="rank|2-D|2D|dimension"):
        Trainer(compose(*generic(tiny), "data=longcrawl64", f"data.path={root}", f"run_dir={tmp_path / 'run'}"))


def test_end_to_end_cli_run_then_resume(train_env, tiny, tmp_path):
    """The real CLI, as a user types it: trains, evaluates, logs, checkpoints; refuses to overwrite; resumes."""
    args = [*tiny, "hydra.run.dir=" + str(tmp_path / "run"), "logger.wandb.mode=offline"]
    out = run_cli(args, train_env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]
    for r in records:
        for key in ("step", "tokens", "best_context_loss", "icl_curve", "bayes_curve", "last10_loss"):
            assert key in r, key
        assert r["icl_curve"][0][0] == 0 and r["icl_curve"][-1][1] == 64
        assert [b[:2] for b in r["bayes_curve"]] == [b[:2] for b in r["icl_curve"]]
        # the lowest bin among those wide enough to trust (longctx.eval.metrics.min_positions_for)
        wide = min_positions_for(64)
        assert r["best_context_loss"] == min(v for a, b, v in r["icl_curve"] if b - a >= wide)
        assert np.isfinite(r["best_context_loss"])
    assert records[-1]["tokens"] == 6 * 8 * 64
    assert (run / "icl_curves.png").stat().st_size > 10_000
    assert (run / "checkpoints" / "step_00000006.pt").exists()
    assert (run / "config.yaml").exists() and any((run / "wandb").iterdir())
    assert "best-context loss" in out.stdout and "Bayes-optimal" in out.stdout

    # the same run again is refused, and nothing is touched
    before = (run / "metrics.jsonl").read_bytes()
    again = run_cli(args, train_env, tmp_path)
    assert again.returncode != 0 and "trainer.resume" in again.stderr
    assert "Traceback" not in again.stderr  # bad input: one clear line, not a stack trace
    assert (run / "metrics.jsonl").read_bytes() == before

    # resume: continue to 9 steps
    more = run_cli([*args, "trainer.resume=true", "trainer.max_steps=9"], train_env, tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 6, 9]
    assert "resuming from" in more.stdout


def test_resume_after_interruption_is_exact(compose, tiny, tmp_path):
    """Kill after the step-3 checkpoint (simulated: drop what came after it); resuming reproduces step 6 exactly."""
    full = tmp_path / "full"
    Trainer(compose(*tiny, "trainer.keep_checkpoints=5", f"run_dir={full}")).fit()
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    (cut / "checkpoints" / "step_00000006.pt").unlink()
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n")  # a step-6 line written before the kill
    Trainer(compose(*tiny, "trainer.resume=true", f"run_dir={cut}")).fit()
    a = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [3, 6]
    for key in ("train_loss", "best_context_loss", "icl_curve", "per_position_loss", "tokens"):
        assert a[-1][key] == b[-1][key], key


def test_each_launch_s_config_is_kept(compose, tiny, tmp_path):
    """A resume from step N writes the config it trains with (config.resume_step{N}.yaml); a second resume from the
    same step with another config (the first one failed) writes its own beside it, overwriting nothing."""
    run = tmp_path / "run"
    three = [o for o in tiny if not o.startswith("trainer.max_steps")] + ["trainer.max_steps=3"]
    Trainer(compose(*three, "trainer.keep_checkpoints=5", f"run_dir={run}")).fit()
    first = compose(*tiny, "trainer.resume=true", f"run_dir={run}", "optim.lr=0.5")
    failed = Trainer(first)
    failed._write_config()   # as a launch that then failed would have left it
    failed.close()
    Trainer(compose(*tiny, "trainer.resume=true", f"run_dir={run}", "optim.lr=0.002")).fit()
    kept = sorted(p.name for p in run.glob("config*.yaml"))
    assert kept == ["config.resume_step3.launch2.yaml", "config.resume_step3.yaml", "config.yaml"]
    assert OmegaConf.load(run / "config.resume_step3.yaml").optim.lr == 0.5
    assert OmegaConf.load(run / "config.resume_step3.launch2.yaml").optim.lr == 0.002


@pytest.mark.parametrize("attention", ["exp", "power"])
def test_each_attention_trains_through_the_cli_config(compose, tiny, tmp_path, attention):
    rec = Trainer(compose(*tiny, f"attention={attention}", f"run_dir={tmp_path / attention}")).fit()
    assert np.isfinite(rec["best_context_loss"]) and rec["step"] == 6


def test_paper_recipe_composes(compose):
    cfg = compose("experiment=paper", "attention=power", "data.path=/data/lc64")
    validate(cfg)
    assert (cfg.ctx, cfg.model.name, cfg.data.name, cfg.optim.lr, cfg.optim.warmup_steps) == (
        65536, "small", "longcrawl64", 3e-4, 2000)
    assert cfg.trainer.precision == "bf16" and cfg.trainer.activation_checkpointing
    assert compose("experiment=paper", "ctx=8192").ctx == 8192  # the command line still wins


def test_flops_budget_stops_the_run(compose, tiny, tmp_path):
    trainer = Trainer(compose(*tiny, f"run_dir={tmp_path / 'run'}"))
    per_step = trainer.flops["train_flops_per_token"] * 8 * 64  # docs_per_batch x ctx tokens per step
    trainer.cfg.trainer.flops_budget = 2.5 * per_step
    rec = trainer.fit()
    assert rec["step"] == 3 and rec["flops"] == pytest.approx(3 * per_step)
    assert rec["weight_flops_per_token"] > 0 and rec["state_flops_per_token"] > 0


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_non_finite_loss_is_never_silent(compose, tiny, tmp_path, policy, capsys):
    trainer = Trainer(compose(*tiny, f"trainer.on_nonfinite={policy}", "trainer.max_skipped_steps=2",
                              f"run_dir={tmp_path / policy}"))
    forward = trainer.model.forward

    def poisoned(input_ids, targets=None, **kwargs):  # steps 2 and 3 produce NaN losses
        out = forward(input_ids, targets, **kwargs)
        return out * float("nan") if trainer.step in (1, 2) else out

    trainer.model.forward = poisoned
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    if policy == "stop":
        with pytest.raises(FloatingPointError, match=r"non-finite loss and grad_norm at step 2"):
            trainer.fit()
        return
    rec = trainer.fit()
    assert rec["skipped_steps"] == 2 and rec["step"] == 6 and np.isfinite(rec["best_context_loss"])
    assert "warning: " in capsys.readouterr().err  # warnings go to stderr (and train.log), one line each
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_too_many_non_finite_steps_in_a_row_stop(compose, tiny, tmp_path):
    trainer = Trainer(compose(*tiny, "trainer.on_nonfinite=skip", "trainer.max_skipped_steps=1",
                              f"run_dir={tmp_path / 'run'}"))
    forward = trainer.model.forward
    trainer.model.forward = lambda input_ids, targets=None, **kw: forward(input_ids, targets, **kw) * float("inf")
    with pytest.raises(FloatingPointError, match="max_skipped_steps=1"):
        trainer.fit()


def test_cli_bad_value_is_one_line_naming_the_key(train_env, tmp_path):
    out = run_cli(["attention=power", "p=7", f"hydra.run.dir={tmp_path / 'run'}"], train_env, tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: config: p=7: power attention supports integer degrees 1..4"]
    assert not (tmp_path / "run").exists()  # nothing written: not even the empty folder Hydra made


def test_an_experiment_grid_without_multirun_says_it_trains_one_point(train_env, tmp_path):
    """experiment=X whose config sweeps (hydra.sweeper.params), launched without -m, says so before anything runs
    (here a resume with nothing to resume stops it next); a plain launch says nothing of the kind."""
    out = run_cli(["experiment=recall_state_cpu", "trainer.resume=true", f"hydra.run.dir={tmp_path / 'run'}"],
                  train_env, tmp_path)
    assert out.returncode == 2
    note, error = out.stderr.strip().splitlines()
    assert note.startswith("note: experiment=recall_state_cpu sweeps +experiment/arm, data.n_pairs") and "-m" in note
    assert error.startswith("error: trainer.resume=true but")
    plain = run_cli(["trainer.resume=true", f"hydra.run.dir={tmp_path / 'run2'}"], train_env, tmp_path)
    assert plain.returncode == 2 and "note:" not in plain.stderr


def test_train_keeps_autotune_winners_unless_told(monkeypatch):
    """train.py turns on Triton's on-disk autotuning cache (FLA's first-call benchmarks, ~90 s per shape) unless the
    environment already says otherwise."""
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    runpy.run_path(str(REPO / "train.py"), run_name="train_module")
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "0")
    runpy.run_path(str(REPO / "train.py"), run_name="train_module")
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "0"


OPTIONS = {group: ", ".join(sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml")))
           for group in ("attention", "model", "arch")}


@pytest.mark.parametrize("args,message", [
    (["trainer.max_stepz=3"], "config: trainer.max_stepz=3: unknown key (no config file defines it; did you mean "
                              "trainer.max_steps?)"),
    (["+trainer.max_stepz=3"], "config: trainer.max_stepz=3: unknown key (no config file defines it; did you mean "
                               "trainer.max_steps?)"),
    (["attention=powr"], f"config: attention=powr: no such attention option; did you mean power? (options: "
                         f"{OPTIONS['attention']})"),
    (["model=huge"], f"config: model=huge: no such model option (options: {OPTIONS['model']})"),
    (["arch=rwkv"], f"config: arch=rwkv: no such arch option; did you mean rwkv7? (options: {OPTIONS['arch']})"),
    (["-m", "seed=0,1", "attention=exp,powr"], f"config: attention=powr: no such attention option; did you mean "
                                               f"power? (options: {OPTIONS['attention']})"),
    (["-m", "seed=0,1", "optim.lrr=1e-3,3e-3"], "config: optim.lrr=1e-3,3e-3: unknown key (no config file defines "
                                                "it; did you mean optim.lr?)"),
    # a key typed without its group: the one key of that name, not the closest spelling (max_steps -> first_steps)
    (["max_steps=5"], "config: max_steps=5: unknown key (no config file defines it; did you mean trainer.max_steps?)"),
    (["lr=1e-3"], "config: lr=1e-3: unknown key (no config file defines it; did you mean optim.lr?)"),
    (["~trainer.compil"], "config: ~trainer.compil: unknown key (no config file defines it; did you mean "
                          "trainer.compile?)"),
    (["data.path=/x"], "config: data.path=/x: data=icl_markov has no key path (only data=longcrawl64, source_corpus; "
                       "pick one, e.g. data=longcrawl64 data.path=/x)"),
    (["attention=power", "attention.sink=true"], "config: attention.sink=true: attention=power has no key sink (only "
                                                 "attention=exp; pick one, e.g. attention=exp attention.sink=true)"),
    # a key that only other options (and the experiments' recipes) set: named, with `+` too (nothing would read it)
    (["data=longcrawl64", "data.path=/x", "data.train_tokens=5"], "config: data.train_tokens=5: data=longcrawl64 has "
     "no key train_tokens (only data=icl_markov, icl_markov_long, icl_markov_long16k, icl_markov_long_cpu, "
     "icl_markov_long_disjoint, mqar; pick one, e.g. data=icl_markov data.train_tokens=5)"),
    (["arch=llama", "+arch.token_shift=true"], "config: +arch.token_shift=true: arch=llama has no key token_shift "
                                               "(only arch=gpt2; pick one, e.g. arch=gpt2 +arch.token_shift=true)"),
    # under an experiment, the options its recipe composes (Hydra's several lines; p was silently unused)
    (["experiment=icl_small", "data.path=/x"], "config: data.path=/x: experiment=icl_small composes "
                                               "data=icl_markov_long, which has no key path; pick another data with "
                                               "it, or leave data.path out"),
    (["experiment=recall_state", "p=3"], "config: p=3: experiment=recall_state composes attention=exp, which does not "
                                         "read p (only attention=power does); add attention=power, or leave p out"),
    (["experiment=icl_small", "window=64"], "config: window=64: experiment=icl_small composes attention=exp, which "
                                            "does not read window (only attention=window does); add attention=window, "
                                            "or leave window out"),
])
def test_mistyped_override_is_one_line_with_the_closest_name(train_env, tmp_path, args, message):
    """A typo in a key or a group option (with or without `+`, in a sweep too) is named in one line with the closest
    valid name, exit 2, before Hydra makes a run or sweep folder."""
    folders = [f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    out = run_cli([*args, *folders], train_env, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("args,message", [
    (["--ctx", "512"], "config: --ctx: overrides are key=value, without dashes: ctx=512"),
    (["--trainer.max_steps=5"], "config: --trainer.max_steps=5: overrides are key=value, without dashes: "
                                "trainer.max_steps=5"),
    (["--max-steps", "5"], "config: --max-steps: overrides are key=value, without dashes: trainer.max_steps=5"),
    (["--attention", "power"], "config: --attention: overrides are key=value, without dashes: attention=power"),
])
def test_a_key_typed_as_an_option_is_one_line_naming_the_override(train_env, tmp_path, args, message):
    """`--ctx 512` (argparse habit) names the override it means, in one line, exit 2; Hydra's usage printed twice
    with `unrecognized arguments` said neither."""
    out = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], train_env, tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "run").exists()


def test_an_unknown_option_prints_hydra_s_usage_once(train_env, tmp_path):
    out = run_cli(["--bogus"], train_env, tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("usage: train.py") == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "train.py: error: unrecognized arguments: --bogus"


def test_valid_overrides_of_every_kind_pass_the_override_check():
    """Sweeps, `~key` deletion, `hydra.*` and Hydra's groups, lists, dict values and null options are Hydra's valid
    syntax and keys: the check lets them through (a refusal would raise)."""
    from longctx.train.launch import check_overrides

    check_overrides(["seed=0,1,2", "attention=exp,power", "data=choice(icl_markov,longcrawl64)", "seed=range(3)",
                     "~trainer.stages", "hydra.run.dir=x", "hydra/launcher=basic", "+hydra.job.env_set.A=1",
                     "optim.betas=[0.9,0.95]", "experiment=null", "experiment=paper", "experiment/arm=power_p2",
                     "logger.wandb={mode:disabled}", "+trainer.stages=[{ctx:64},{}]", "optim=adamw",
                     "data=glob(icl_*)"], REPO / "conf")
    check_overrides(["data=longcrawl64", "data.path=/x"], REPO / "conf")    # a key of the chosen option
    check_overrides(["experiment=paper", "data.path=/x"], REPO / "conf")    # the recipe picks data=longcrawl64
    from longctx.train.launch import check_under_experiment
    for args in (["experiment=paper", "data.path=/x"], ["experiment=recall_state", "+experiment/arm=power_p3", "p=2"],
                 ["experiment=icl_small", "attention=window", "window=64"], ["experiment=icl_small", "cache_dir=/c"],
                 ["experiment=recall_state", "data.n_pairs=64", "optim.lr=1e-3", "hydra.run.dir=x"]):
        check_under_experiment(args, REPO / "conf")    # what the recipe composes has and reads these keys


def test_top_level_key_is_refused_only_under_an_option_that_ignores_it():
    """`cache_dir=` is refused exactly under the data options whose composed config does not read it: those
    extending a reader through their defaults list (data=icl_markov_long extends icl_markov) read it too."""
    from hydra import compose, initialize_config_dir

    from longctx.train.launch import check_overrides

    options = sorted(path.stem for path in (REPO / "conf" / "data").glob("*.yaml"))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        reads = {option: compose("config", [f"data={option}", "cache_dir=/elsewhere"]).data.get("cache_dir")
                 == "/elsewhere" for option in options}
    assert reads["icl_markov_long"] and not reads["longcrawl64"]
    for option in options:
        if reads[option]:
            check_overrides([f"data={option}", "cache_dir=/elsewhere"], REPO / "conf")
        else:
            with pytest.raises(ValueError, match=f"data={option} does not read cache_dir"):
                check_overrides([f"data={option}", "cache_dir=/elsewhere"], REPO / "conf")


def test_a_sweep_without_multirun_is_one_line_naming_it(train_env, tmp_path):
    """`attention=power,exp` without -m: one line naming the override and -m (Hydra's own answer spans five lines);
    a list value is one value, and the same sweep with -m passes the check."""
    out = run_cli(["attention=power,exp", f"hydra.run.dir={tmp_path / 'run'}"], train_env, tmp_path)
    assert out.returncode == 2 and not (tmp_path / "run").exists()
    assert out.stderr.strip().splitlines() == ["error: config: attention=power,exp: several values are a sweep, "
                                               "which runs with -m (python train.py -m ... attention=power,exp); "
                                               "one run takes one value"]
    from longctx.train.launch import check_command_line
    for argv in (["optim.betas=[0.9,0.95]"], ["-m", "attention=power,exp"]):
        assert check_command_line(argv, REPO / "conf")[:len(argv)] == argv


def test_a_top_level_key_and_the_group_key_reading_it_are_not_both_set():
    """`p=2 attention.p=3`: attention.p would win and p be silently unused (the run's config showing both); refused
    naming both, in either order. Either alone passes."""
    from longctx.train.launch import check_overrides

    for args in (["attention=power", "p=2", "attention.p=3"], ["attention=power", "attention.p=3", "p=2"]):
        with pytest.raises(ValueError, match=r"p=2 and attention.p=3|attention.p=3 and p=2"):
            check_overrides(args, REPO / "conf")
    check_overrides(["attention=power", "p=3"], REPO / "conf")
    check_overrides(["attention=power", "attention.p=3"], REPO / "conf")


def test_cfg_job_prints_resolved_values(train_env, tmp_path):
    """`--cfg job` shows what a run gets: the attention's degree and the run name, not their `${...}` sources."""
    out = run_cli(["--cfg", "job", "attention=power", "p=3"], train_env, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "${" not in out.stdout
    import yaml
    shown = yaml.safe_load(out.stdout)
    assert shown["attention"]["p"] == 3 and shown["attention"]["tag"] == "power_p3"
    assert shown["run_name"] == "gpt2_power_p3_d64l3_icl_markov_ctx128_s0"
    # the folder a run would write (Hydra's output folder, which --cfg never makes), and a given one as given
    assert shown["run_dir"] == str(tmp_path / "runs" / shown["run_name"])
    for given, folder in (("run_dir=/tmp/a", "/tmp/a"), ("hydra.run.dir=/tmp/b", "/tmp/b")):
        shown = yaml.safe_load(run_cli(["--cfg", "job", given], train_env, tmp_path).stdout)
        assert shown["run_dir"] == folder
    shown = yaml.safe_load(run_cli(["--cfg", "job", "optim.lr=0.001"], train_env, tmp_path).stdout)
    assert shown["run_name"].endswith("_lr0.001") and shown["run_dir"] == str(tmp_path / "runs" / shown["run_name"])
    after = run_cli(["optim.lr=0.001", "--cfg", "job"], train_env, tmp_path)   # the order `--help` shows
    assert after.returncode == 0, after.stderr[-2000:]
    assert yaml.safe_load(after.stdout) == shown
    assert not (tmp_path / "runs").exists()  # printing made no folder
    # a run given run_dir=X leaves no empty runs/<name> from Hydra in the folder it was launched from
    done = run_cli(["trainer.max_steps=1", "trainer.eval_every=1", "logger.wandb.mode=disabled",
                    f"run_dir={tmp_path / 'mine'}"], train_env, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "mine" / "metrics.jsonl").exists() and not (tmp_path / "runs").exists()
    elsewhere = tmp_path / "scratch_runs"  # a `runs` linked elsewhere is the user's: nothing removed through it
    elsewhere.mkdir()
    (tmp_path / "runs").symlink_to(elsewhere)
    done = run_cli(["trainer.max_steps=1", "trainer.eval_every=1", "logger.wandb.mode=disabled",
                    f"run_dir={tmp_path / 'mine2'}"], train_env, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert elsewhere.is_dir() and (tmp_path / "runs").is_symlink()


def test_default_run_shorter_than_its_warmup_trains_with_a_scaled_warmup(train_env, tmp_path):
    """`python train.py trainer.max_steps=20` (warmup 50 by default): the warmup is scaled to 10% of the run, said
    in one line, and the recorded lrs follow that schedule's closed form."""
    def closed_form(step, lr=3e-3, min_lr=1e-5, warmup=2, max_steps=20):  # conf/optim/adamw.yaml; 10% of 20
        if step < warmup:
            return lr * (step + 1) / warmup
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (max_steps - warmup))))

    run = tmp_path / "run"
    out = run_cli(["trainer.max_steps=20", "trainer.eval_every=10", "logger.wandb.mode=disabled",
                   "data.eval_docs=32", "trainer.num_threads=2", f"hydra.run.dir={run}"], train_env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stdout.splitlines() if "optim.warmup_steps=50" in line]
    assert said == ["optim.warmup_steps=50 is longer than the run (20 steps, trainer.max_steps): warming up over 2 "
                    "steps instead (10% of it)"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20]
    for r in records:  # the lr of the step after each evaluation (docs/gpu.md (Run folders and resuming))
        assert r["lr"] == pytest.approx(closed_form(r["step"]), rel=1e-9)


@pytest.mark.parametrize("script,args,message", [
    ("compare_train_paths.py", ["--overrides", "attention=powr"], "error: --overrides: config: attention=powr: no "
                                                                   "such attention option; did you mean power?"),
    ("bench_train.py", ["--variant", "x=trainer.max_stepz=3", "--out", "{tmp}/out"],
     "error: --variant x: config: trainer.max_stepz=3: unknown key (no config file defines it; did you mean "
     "trainer.max_steps?)"),
])
def test_scripts_composing_configs_name_a_mistyped_override(tmp_path, script, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith(message), out.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_starting_is_one_line(train_env, tmp_path):
    """Ctrl-C while train.py is still importing and checking (before the training steps' own handler): one line, not a
    traceback through whatever was loading; the process ends as SIGINT would end it."""
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), f"hydra.run.dir={tmp_path / 'run'}"],
                            env=train_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)                                  # torch alone takes longer than this to import
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT)
    assert err.strip().splitlines() == ["interrupted by Ctrl-C while starting, before the first training step; "
                                        "relaunch the same command to start it"]


def test_the_hook_leaves_other_errors_to_python(capsys):
    hook = runpy.run_path(str(REPO / "train.py"), run_name="train_module")["interrupted_while_starting"]
    try:
        raise RuntimeError("boom")
    except RuntimeError as err:
        hook(RuntimeError, err, err.__traceback__)
    assert "Traceback" in capsys.readouterr().err
