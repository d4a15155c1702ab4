"""Run folders, checkpoints and resume under bad input: each case ends in one line naming the field, value or file,
and writes nothing (or, where the run can go on safely, goes on saying what it did). One tiny trained run is shared;
each test works on its own copy."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import longctx.evaluate as evaluate_cli
import longctx.generate as generate_cli
from longctx import load_run, naming, provenance
from longctx.data.identity import IDENTITY_FILE, data_identity, read_identity
from longctx.models import build_model
from longctx.models.spec import model_spec
from longctx.runs import RunError
from longctx.train import checkpoint as ckpt
from longctx.train.stages import StagedRun
from longctx.train.trainer import Trainer


@pytest.fixture(scope="module")
def run6(train_run, tmp_path_factory, tiny_overrides):
    """A 6-step run of the default model (exp attention), checkpoints at steps 3 and 6."""
    return train_run(tmp_path_factory.mktemp("hostile") / "run", list(tiny_overrides))


def copy_run(run6: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run6, copy)
    return copy


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def newest(run: Path) -> Path:
    return ckpt.latest_checkpoint(run)[1]


def rewrite_checkpoint(path: Path, change) -> None:
    state = ckpt.load_checkpoint(path)
    change(state)
    torch.save(state, path)


def resume(compose, tiny, run: Path, *extra: str):
    return Trainer(compose(*tiny, "trainer.resume=true", f"run_dir={run}", *extra))


# ----- data identity --------------------------------------------------------------------------------------------
def test_a_run_records_the_identity_of_its_data(run6):
    recorded = read_identity(run6)
    config = OmegaConf.load(run6 / "config.yaml")
    train = Path(recorded["train"]["path"])
    assert train.parent.parent == Path(config.data.cache_dir).resolve() and train.name == "train.zarr"
    assert recorded == data_identity(train, train.with_name("heldout.zarr"))


def test_resume_on_moved_data_goes_on_and_on_replaced_data_is_refused(run6, compose, tiny, tmp_path, capsys):
    run = copy_run(run6, tmp_path)
    recorded = read_identity(run)
    root = Path(recorded["train"]["path"]).parent
    moved_cache = tmp_path / "moved_cache"
    shutil.copytree(root, moved_cache / root.name)
    capsys.readouterr()
    resume(compose, tiny, run, "trainer.max_steps=9", f"data.cache_dir={moved_cache}").close()
    assert f"is now read from {moved_cache / root.name}" in capsys.readouterr().out
    assert read_identity(run) == recorded  # written once, at the first launch

    import zarr
    tokens = zarr.open(str(moved_cache / root.name / "train.zarr"), mode="r+")
    tokens[0, 1:5] = (tokens[0, 1:5] + 1) % 4  # the same path, other data
    before = snapshot(run)
    with pytest.raises(ValueError) as err:
        resume(compose, tiny, run, "trainer.max_steps=12", f"data.cache_dir={moved_cache}")
    message = str(err.value)
    assert message.startswith("data.path: ") and recorded["id"] in message
    assert data_identity(moved_cache / root.name / "train.zarr", moved_cache / root.name / "heldout.zarr")["id"] \
        in message and "\n" not in message
    assert snapshot(run) == before


def test_a_run_without_an_identity_gets_one_at_resume(run6, compose, tiny, tmp_path, capsys):
    run = copy_run(run6, tmp_path)
    (run / IDENTITY_FILE).unlink()
    capsys.readouterr()
    resume(compose, tiny, run, "trainer.max_steps=9").close()
    assert read_identity(run) == read_identity(run6)
    assert sum(IDENTITY_FILE in line for line in capsys.readouterr().out.splitlines()) == 1


# ----- checkpoints --------------------------------------------------------------------------------------------
def test_a_newer_schema_checkpoint_is_refused_never_skipped(run6, compose, tiny, tmp_path):
    run = copy_run(run6, tmp_path)
    rewrite_checkpoint(newest(run), lambda s: s.update(schema_version=ckpt.SCHEMA_VERSION + 1))
    before = snapshot(run)
    with pytest.raises(ValueError) as err:
        resume(compose, tiny, run, "trainer.max_steps=9")
    message = str(err.value)
    assert str(newest(run)) in message and f"schema version {ckpt.SCHEMA_VERSION + 1}" in message
    assert f"this longctx's {ckpt.SCHEMA_VERSION}" in message
    assert snapshot(run) == before
    with pytest.raises(RunError, match="newer than this longctx"):
        load_run(run, device="cpu")


def test_a_checkpoint_without_a_step_count_is_named(run6, compose, tiny, tmp_path):
    run = copy_run(run6, tmp_path)
    for _, path in ckpt.list_checkpoints(run)[:-1]:
        path.unlink()
    rewrite_checkpoint(newest(run), lambda s: s["trainer"].pop("step"))
    before = snapshot(run)
    with pytest.raises(ValueError, match=rf"{newest(run)} is unreadable \(its trainer state has no step count"):
        resume(compose, tiny, run, "trainer.max_steps=9")
    assert snapshot(run) == before


def linear_checkpoint(compose, tiny, vocab_size: int) -> dict:
    """A checkpoint of another model (linear attention) of the same shape, as another run would write it."""
    cfg = compose(*tiny, "attention=linear", "run_dir=/elsewhere")
    spec = model_spec(cfg, vocab_size)
    return {"schema_version": ckpt.SCHEMA_VERSION, "model": build_model(spec).state_dict(),
            "config": OmegaConf.to_container(cfg, resolve=True), "spec": dict(spec.__dict__)}


def test_a_checkpoint_of_another_model_is_refused_by_every_loader(run6, compose, tiny, tmp_path, capsys):
    run = copy_run(run6, tmp_path)
    vocab = ckpt.load_checkpoint(newest(run))["spec"]["vocab_size"]
    foreign = ckpt.checkpoint_dir(run) / "step_00000009.pt"
    torch.save(linear_checkpoint(compose, tiny, vocab), foreign)
    with pytest.raises(RunError) as err:
        load_run(run, device="cpu")
    assert str(foreign) in str(err.value) and "attention." in str(err.value)
    before = snapshot(run)
    assert generate_cli.main([str(run), "--prompt-ids", "1,2", "--temperature", "0", "--device", "cpu"]) == 2
    assert evaluate_cli.main([str(run), "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"error: {foreign}") for line in lines)
    assert snapshot(run) == before
    # an interpolation added to config.yaml (one that would not resolve) does not switch the check off
    with open(run / "config.yaml", "a") as f:
        f.write("junk: ${oc.env:LONGCTX_NOT_SET_ANYWHERE}\n")
    with pytest.raises(RunError, match="a checkpoint of another model"):
        load_run(run, device="cpu")


def test_non_finite_weights_are_refused_naming_the_tensor(run6, tmp_path, capsys):
    run = copy_run(run6, tmp_path)
    names = list(ckpt.load_checkpoint(newest(run))["model"])
    rewrite_checkpoint(newest(run), lambda s: s["model"][names[1]].view(-1).__setitem__(0, float("nan")))
    with pytest.raises(RunError, match=rf"{newest(run)}: non-finite weights \({names[1]} holds NaN"):
        load_run(run, device="cpu")
    for temperature in ("0", "1"):
        assert generate_cli.main([str(run), "--prompt-ids", "1,2", "--temperature", temperature,
                                  "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {newest(run)}: non-finite weights")
    model, _ = load_run(run, step=3, device="cpu")  # the earlier checkpoint is fine
    assert model.checkpoint_step == 3


# ----- generate's arguments -------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["foo", "cuda"])
def test_generate_names_a_device_it_cannot_use(run6, device, capsys):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is there")
    assert generate_cli.main([str(run6), "--prompt-ids", "1,2", "--device", device]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --device={device!r}: ")


def test_generate_refuses_more_tokens_than_memory_holds_before_allocating(run6, capsys):
    assert generate_cli.main([str(run6), "--prompt-ids", "1,2", "--max-new-tokens", "1000000000",
                              "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --max-new-tokens=1000000000: 2 + 1000000000 tokens need")


# ----- run-folder files -----------------------------------------------------------------------------------------
def test_a_linked_lock_file_is_refused_and_its_target_untouched(run6, compose, tiny, tmp_path):
    run = copy_run(run6, tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (run / ".lock").symlink_to(target)
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"lock file .*\.lock is a symbolic link"):
        resume(compose, tiny, run, "trainer.max_steps=9")
    assert target.read_text() == "keep me\n" and snapshot(run) == before and (run / ".lock").is_symlink()


def test_a_linked_run_file_is_refused(run6, compose, tiny, tmp_path):
    run = copy_run(run6, tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (run / "metrics.jsonl").rename(tmp_path / "metrics.jsonl")
    (run / "metrics.jsonl").symlink_to(target)
    with pytest.raises(ValueError, match=r"metrics.jsonl is a symbolic link"):
        resume(compose, tiny, run, "trainer.max_steps=9")
    assert target.read_text() == "keep me\n"


def test_writes_never_follow_links(tmp_path):
    from longctx.train.run_files import open_new, write_atomic

    target = tmp_path / "target"
    target.write_text("keep me\n")
    link = tmp_path / "file"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        open_new(link)
    write_atomic(link, "new\n")  # the link itself is replaced
    assert target.read_text() == "keep me\n" and link.read_text() == "new\n" and not link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "target"]  # no temp file left


def test_resume_over_a_cut_metrics_line_a_listed_provenance_and_a_linked_temp_trains_on(run6, compose, tiny,
                                                                                        tmp_path, capsys):
    """A kill mid-append cuts the last metrics line: dropped with a line saying so. A provenance.json that is not a
    record is kept aside with a line. A leftover temp name that is a link is never written through."""
    run = copy_run(run6, tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "tok')
    (run / provenance.FILE).write_text("[1, 2]\n")
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (run / "provenance.json.tmp").symlink_to(target)
    resume(compose, tiny, run, "trainer.max_steps=9").fit()
    warnings = capsys.readouterr().err.splitlines()
    assert sum(m.startswith(f"warning: {run / 'metrics.jsonl'}: line 3 is cut short") for m in warnings) == 1
    assert sum(m.startswith(f"warning: {run / provenance.FILE}: not a provenance record (a JSON list")
               for m in warnings) == 1
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [3, 6, 9]
    assert (run / "provenance.json.unreadable").read_text() == "[1, 2]\n"
    assert isinstance(provenance.read(run), dict) and target.read_text() == "keep me\n"


def test_a_metrics_line_that_is_not_a_record_is_named_before_anything_is_written(run6, compose, tiny, tmp_path):
    run = copy_run(run6, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": 4', lines[1]]) + "\n")
    before = snapshot(run)
    with pytest.raises(ValueError, match=rf"{run / 'metrics.jsonl'}: line 2 is not an evaluation record"):
        resume(compose, tiny, run, "trainer.max_steps=9")
    assert snapshot(run) == before


def test_a_bad_stored_wandb_id_is_named_before_anything_is_written(run6, compose, tiny, tmp_path):
    run = copy_run(run6, tmp_path)
    (run / "wandb_id").write_text("not an id/at all\n")
    before = snapshot(run)
    with pytest.raises(ValueError, match=rf"{run / 'wandb_id'}: 'not an id/at all' is not a wandb run id"):
        resume(compose, tiny, run, "trainer.max_steps=9", "logger.wandb.mode=offline")
    assert snapshot(run) == before


def test_provenance_that_is_not_a_record_is_one_line(tmp_path):
    (tmp_path / provenance.FILE).write_text('["a list"]\n')
    with pytest.raises(ValueError, match=rf"{tmp_path / provenance.FILE}: not a provenance record \(a JSON list"):
        provenance.read(tmp_path)


# ----- staged runs ----------------------------------------------------------------------------------------------
def test_a_later_stage_that_does_not_fit_the_data_fails_before_the_first_trains(compose, tiny, tmp_path):
    cfg = compose(*tiny, f"run_dir={tmp_path / 'run'}", "data.doc_len=64", "device=cpu",
                  "trainer.stages=[{ctx:32,trainer.max_steps:1},{ctx:128}]")
    with pytest.raises(ValueError, match=r"^trainer.stages\[1\]: ctx=128 is larger than the documents"):
        StagedRun(cfg)
    assert not (tmp_path / "run").exists()


# ----- sweep names ----------------------------------------------------------------------------------------------
def hydra_job(cfg, tmp_path, mode, sweep_overrides: list[str], job_overrides: list[str], monkeypatch):
    """The run name of `cfg` as Hydra's job of a multirun (mode MULTIRUN, its sweep folder's multirun.yaml) or of a
    run would resolve it."""
    from hydra.core.hydra_config import HydraConfig

    sweep = tmp_path / "sweep"
    sweep.mkdir(exist_ok=True)
    (sweep / "multirun.yaml").write_text(OmegaConf.to_yaml({"hydra": {"overrides": {"task": sweep_overrides}}}))
    hydra = OmegaConf.create({"hydra": {"mode": mode, "sweep": {"dir": str(sweep)}}})
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra.hydra))
    monkeypatch.setattr(naming, "task_overrides", lambda: job_overrides)
    return naming.run_name(cfg)


@pytest.mark.parametrize("key,values", [("trainer.max_steps", ("5", "10")), ("trainer.flops_budget", ("5e9", "1e10"))])
def test_a_sweep_over_run_length_gives_each_job_its_folder(compose, tmp_path, monkeypatch, key, values):
    from hydra.types import RunMode

    cfg = compose()
    names = [hydra_job(cfg, tmp_path, RunMode.MULTIRUN, [f"{key}={','.join(values)}"], [f"{key}={v}"],
                       monkeypatch) for v in values]
    short = key.split(".")[-1]
    assert all(n.endswith(f"_{short}{v}") for n, v in zip(names, values)) and names[0] != names[1]
    # a plain run (or a multirun that sets it to one value) continues the same folder when it changes
    plain = {hydra_job(cfg, tmp_path, RunMode.RUN, [], [f"{key}={v}"], monkeypatch) for v in values}
    single = {hydra_job(cfg, tmp_path, RunMode.MULTIRUN, [f"{key}={v}"], [f"{key}={v}"], monkeypatch)
              for v in values}
    assert len(plain) == 1 and plain == single and not next(iter(plain)).endswith(short + values[0])


def test_a_sweep_in_the_sweepers_params_names_its_jobs_too():
    assert naming.swept_keys([], {"trainer.max_steps": "5,10", "seed": "0,1"}) == {"trainer.max_steps"}
    assert naming.swept_keys(["trainer.flops_budget=range(1,3)", "trainer.max_steps=7"]) == {"trainer.flops_budget"}


def test_a_config_edited_after_training_is_refused_by_the_report(run6, tmp_path):
    """config.yaml changed to another attention and seed than the launch's command line set (provenance.json):
    the report's reader refuses the run naming the key, where the untouched run (and one whose command set the same
    values in another spelling) loads."""
    import json

    from longctx.report.runs import load_run

    run = copy_run(run6, tmp_path)
    record = json.loads((run / "provenance.json").read_text())
    record.setdefault("launches", [record])[0]["overrides"] = ["attention=exp", "seed=0", "optim.lr=3e-3"]
    (run / "provenance.json").write_text(json.dumps(record))
    config = (run / "config.yaml").read_text()
    assert "lr: 0.003" in config and load_run(run).seed == 0   # 3e-3 on the command line is 0.003 in the config
    (run / "config.yaml").write_text(config.replace("seed: 0", "seed: 7"))
    with pytest.raises(ValueError) as caught:
        load_run(run)
    assert str(caught.value) == (f"{run / 'config.yaml'}: seed=7, but the run was launched with seed=0 "
                                 f"(provenance.json): the config was edited after training; restore it")


def test_a_per_document_record_replaced_by_other_losses_of_the_same_means_is_refused(run6, tmp_path):
    """Each document's losses shifted against each other, every bin's mean kept: the means check cannot tell, the
    digest the trainer wrote beside the record's name does."""
    import json

    import numpy as np

    from longctx.report.runs import load_run

    run = copy_run(run6, tmp_path)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert load_run(run).doc_bins(last) is not None   # the untouched record loads
    path = run / last["doc_bins"]
    arrays = dict(np.load(path, allow_pickle=False))
    loss = arrays["loss"].astype(np.float64)
    arrays["loss"] = (loss + np.linspace(-0.1, 0.1, len(loss))[:, None]).astype(np.float32)   # the means barely move
    np.savez_compressed(path, **arrays)
    with pytest.raises(ValueError, match=r"its losses are not those .* wrote \(digest [0-9a-f]{16}, the record says "
                                         r"[0-9a-f]{16}\): the file was replaced"):
        load_run(run).doc_bins(last)
