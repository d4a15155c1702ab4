"""Run names say what runs, and a sweep's folders are keyed by them: a relaunched sweep resumes, never duplicates."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import yaml

from longctx import naming
from longctx.naming import override_suffix, run_name

REPO = Path(__file__).resolve().parents[2]


def test_the_model_part_is_the_shape_that_runs(compose):
    assert compose().run_name == "gpt2_exp_d64l3_icl_markov_ctx128_s0"  # model=tiny: d_model 64, 3 layers
    cfg = compose("+experiment/size=d256l4", "model.d_model=32", "model.n_layers=1")
    assert cfg.model.name == "d256l4"  # the preset's tag, no longer true ...
    assert cfg.run_name.startswith("gpt2_exp_d32l1_")  # ... the name says the shape


def test_attention_parameters_and_seed_are_named(compose):
    assert compose("attention=power", "p=4", "seed=3").run_name == "gpt2_power_p4_d64l3_icl_markov_ctx128_s3"
    assert compose("arch=rwkv7", "attention=window", "window=64").run_name.startswith("rwkv7_window64_")


def test_the_attention_tag_is_the_degree_and_window_that_run(compose):
    """attention.p / attention.window (the attention's own keys) name the run as p / window do: the tag follows the
    value the core is built with, never the top-level default."""
    for overrides, tag in ((["attention=power", "attention.p=3"], "power_p3"), (["attention=power", "p=4"], "power_p4"),
                           (["attention=window", "attention.window=64"], "window64")):
        cfg = compose(*overrides)
        assert cfg.attention.tag == tag
        assert run_name(cfg, overrides) == f"gpt2_{tag}_d64l3_icl_markov_ctx128_s0"  # no _p3 / _window64 suffix


def test_a_prepared_dataset_is_named_by_its_folder(compose, tmp_path):
    cfg = compose("data=longcrawl64", f"data.path={tmp_path / 'pages'}", "ctx=1024")
    assert cfg.run_name == "gpt2_exp_d64l3_pages_ctx1024_s0"
    assert compose("data=longcrawl64", f"data.path={tmp_path / 'pages'}", "data.tag=web").run_name.split("_")[3] \
        == "web"  # a tag the user set wins
    assert compose("data=icl_markov_long").run_name.split("_d64l3_")[1] == "icl_markov_long_ctx128_s0"


def test_other_overrides_that_change_training_are_appended(compose):
    overrides = ["optim.lr=1e-3", "attention.gating=false", "ctx=64", "trainer.max_steps=9", "logger.wandb.mode=x",
                 "+experiment/size=d128l2", "data.docs_per_batch=8", "hydra.run.dir=/a/b"]
    assert override_suffix(overrides) == "_gatingfalse_docs_per_batch8_lr1e-3"
    assert override_suffix(list(reversed(overrides))) == override_suffix(overrides)  # order of typing: same run
    cfg = compose("attention=power")
    assert run_name(cfg, ["optim.lr=1e-3"]) != run_name(cfg, ["optim.lr=3e-3"])
    assert run_name(cfg, ["trainer.max_steps=100"]) == run_name(cfg, [])  # training further continues the run


def test_a_long_suffix_ends_in_its_digest_and_a_stop_rule_is_not_named(compose):
    """Paths in override values (an init_from under a Hugging Face cache) would pass a folder name's 255 bytes: the
    suffix keeps its first characters and a digest of the whole, the same for the same overrides. trainer.stop_when
    says how long to train, as trainer.max_steps does: not part of the name (`>=` and `<=` once gave one name)."""
    far = "trainer.init_from=/" + "/".join(["a_long_folder_name"] * 12) + "/ckpt"
    suffix = override_suffix([far, "optim.lr=1e-3"])
    assert len(suffix) == naming.MAX_SUFFIX and suffix == override_suffix(["optim.lr=1e-3", far])
    assert suffix.startswith("_lr1e-3_init_from-a_long_folder_name")
    assert suffix != override_suffix([far + "2", "optim.lr=1e-3"])
    assert override_suffix(["optim.lr=1e-3"]) == "_lr1e-3"   # a short one is whole
    cfg = compose()
    assert len(run_name(cfg, [far, "optim.lr=1e-3"]).encode()) < 255
    assert run_name(cfg, ["trainer.stop_when='best_context_loss<=0.99'"]) == run_name(cfg, [])
    swept = override_suffix(["trainer.stop_when=best_context_loss<=0.9"], swept={"trainer.stop_when"})
    assert swept == "_stop_whenbest_context_loss-0.9"   # a sweep over it names each job


def sweep(folder: Path, args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "train.py"), "-m", f"hydra.sweep.dir={folder}", *args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_relaunching_part_of_a_sweep_trains_nothing_twice(train_env, tiny, tmp_path):
    folder = tmp_path / "sweep"
    args = [*tiny, "trainer.max_steps=2", "trainer.eval_every=2"]
    first = sweep(folder, [*args, "seed=0,1"], train_env)
    assert first.returncode == 0, first.stderr[-3000:]
    names = sorted(p.name for p in folder.iterdir() if p.is_dir())
    suffix = "_docs_per_batch8_train_tokens262144_warmup_steps2"  # the tiny overrides that change training
    assert names == [f"gpt2_exp_d64l3_icl_markov_ctx64_s{s}{suffix}" for s in (0, 1)]
    done = folder / names[1] / "metrics.jsonl"
    before = done.read_bytes(), done.stat().st_mtime_ns

    again = sweep(folder, [*args, "seed=1,2"], train_env)  # a subset (seed 1) plus a new job (seed 2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == \
        [f"gpt2_exp_d64l3_icl_markov_ctx64_s{s}{suffix}" for s in (0, 1, 2)]
    assert (done.read_bytes(), done.stat().st_mtime_ns) == before  # seed 1 was not trained again
    assert "is complete (step 2 of trainer.max_steps=2); nothing to do" in again.stdout
    assert "seed=0,1" in (folder / "multirun.launch1.yaml").read_text()  # the first launch's record is kept
    assert "seed=1,2" in (folder / "multirun.yaml").read_text()
    assert [json.loads(x)["step"] for x in (folder / names[1].replace("_s1_", "_s2_") / "metrics.jsonl")
            .read_text().splitlines()] == [2]


def test_a_run_length_swept_by_any_launch_into_a_sweep_folder_stays_named(tmp_path):
    """`trainer.max_steps=2,4`, then one value relaunched into the same folder: the key is still named (the job
    resumes `_max_steps4`, not a copy under the bare name); a folder that never swept it names nothing."""
    def record(name, task):
        (tmp_path / name).write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}, "sweeper": {"params": None}}}))
    record("multirun.yaml", ["trainer.max_steps=4", "seed=0"])
    assert naming.sweep_folder_swept_keys(tmp_path) == set()
    record("multirun.launch1.yaml", ["trainer.max_steps=2,4", "seed=0"])
    assert naming.sweep_folder_swept_keys(tmp_path) == {"trainer.max_steps"}
    (tmp_path / "multirun.launch2.yaml").write_text("{not yaml")   # an unreadable record is passed over
    assert naming.sweep_folder_swept_keys(tmp_path) == {"trainer.max_steps"}
    assert naming.sweep_folder_swept_keys(tmp_path / "none") == set()


def sweep_points():
    """(experiment, the overrides of one job) for every job of every shipped experiment's sweep."""
    for path in sorted((REPO / "conf" / "experiment").glob("*.yaml")):
        params = (yaml.safe_load(path.read_text()).get("hydra") or {}).get("sweeper", {}).get("params")
        if not params:
            continue
        axes = [[f"{key}={v}" for v in str(values).split(",")] for key, values in params.items()]
        for point in itertools.product(*axes):
            yield path.stem, list(point)


def test_every_shipped_sweep_gives_each_job_its_own_folder(compose, monkeypatch):
    """Sweep folders are keyed by the run name: two jobs of one sweep with one name would share a folder."""
    names = {}
    for experiment, point in sweep_points():
        data = ["data.path=/data/lc64"] if experiment.endswith("_paper") else []
        overrides = [f"experiment={experiment}", *data, *point]
        monkeypatch.setattr(naming, "task_overrides", lambda overrides=overrides: overrides)  # as in a Hydra job
        names.setdefault(experiment, []).append(compose(*overrides).run_name)
    assert len(names) >= 10
    for experiment, jobs in names.items():
        assert len(set(jobs)) == len(jobs), (experiment, jobs)


def test_a_recipes_run_name_leaves_out_an_unset_part(compose):
    """A recipe's own run_name (experiment=icl_small, paper_scale, flops_frontier) names data.reshape_block and
    trainer.flops_budget only where they are set: never `_rbNone` or `_fNone`."""
    assert compose("experiment=icl_small").run_name == "gpt2_exp_d256l4_icl_markov_long_ctx4096_b32_s0"
    assert compose("experiment=icl_small", "data.reshape_block=512").run_name.endswith("_b32_rb512_s0")
    for name in ("paper_scale", "flops_frontier", "reshape_ablation", "best_context_table_paper"):
        assert "None" not in compose(f"experiment={name}").run_name, name
    assert compose("experiment=flops_frontier", "trainer.flops_budget=1e16").run_name.endswith("_b32_f1e+16_s0")
    assert naming.name_part("rb", None) == "" and naming.name_part("rb", 0) == "_rb0"


def test_a_recipes_run_name_shows_the_overrides_that_change_training(compose, train_env, tmp_path):
    """A recipe's own run_name (experiment=icl_small, paper_scale, flops_frontier) ends in the overrides its parts do
    not show, as the default name does: two points of an lr sweep are two runs in two folders (they shared one, the
    second finding the first "complete" and training nothing), a shape override is named though the model part is
    the preset's label, and the recipe's plain name is unchanged."""
    def named(experiment, *overrides):
        with naming.given_overrides([experiment, *overrides]):
            return str(compose(experiment, *overrides).run_name)

    plain = "gpt2_exp_d256l4_icl_markov_long_ctx4096_b32_s0"
    assert named("experiment=icl_small") == plain
    assert named("experiment=icl_small", "optim.lr=1e-3") == plain + "_lr1e-3"
    assert named("experiment=icl_small", "optim.lr=1e-3") != named("experiment=icl_small", "optim.lr=3e-3")
    assert named("experiment=icl_small", "model.d_model=128") == plain + "_d_model128"
    assert named("experiment=icl_small", "data.docs_per_batch=16", "data.reshape_block=512", "trainer.max_steps=9",
                 "+experiment/size=d64l2") == "gpt2_exp_d64l2_icl_markov_long_ctx4096_b16_rb512_s0"  # shown, or not
    assert named("experiment=flops_frontier", "arch.token_shift=true").endswith("_s0_token_shifttrue")
    assert named("experiment=paper_scale", "data.path=/x", "optim.lr=1e-4").endswith("_b32_s0_lr1e-4")
    # what train.py itself names the folder (--cfg job: the run_dir a run would write)
    shown = subprocess.run([sys.executable, str(REPO / "train.py"), "--cfg", "job", "experiment=icl_small",
                            "optim.lr=1e-3"], env=train_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert yaml.safe_load(shown.stdout)["run_dir"] == str(tmp_path / "runs" / (plain + "_lr1e-3")), shown.stderr
