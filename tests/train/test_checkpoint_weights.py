"""Checkpoint weights as safetensors: every checkpoint the trainer saves has its model weights beside it in
step_XXXXXXXX.safetensors (tensors only, a tied tensor once, config and spec as metadata), read back without
unpickling anything; pruning takes both files; a run folder holding only these files loads through load_run with the
same logits; checkpoints without one load as before."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from longctx.models import build_model, model_spec
from longctx.runs import RunError, load_run
from longctx.train import checkpoint as ckpt

safetensors = pytest.importorskip("safetensors")


def save_run(compose, run_dir, steps=(3,), keep=2, arch="gpt2"):
    cfg = compose(f"arch={arch}", "attention=power", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
                  "ctx=32", f"run_dir={run_dir}")
    torch.manual_seed(0)
    model = build_model(model_spec(cfg, 16))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    for step in steps:
        state = {"schema_version": ckpt.SCHEMA_VERSION, "model": model.state_dict(), "optimizer": {"lr": 0.1},
                 "config": OmegaConf.to_container(cfg, resolve=True), "spec": dataclasses.asdict(model.spec)}
        ckpt.save_checkpoint(run_dir, step, state, keep=keep)
    return model


def test_weights_are_written_beside_the_checkpoint_and_read_without_pickles(compose, tmp_path):
    model = save_run(compose, tmp_path)
    path = ckpt.checkpoint_dir(tmp_path) / "step_00000003.safetensors"
    with safetensors.safe_open(str(path), framework="pt") as f:
        stored = set(f.keys())
    assert "wte.weight" in stored and "lm_head.weight" not in stored  # tied: stored once
    state = ckpt.read_weights(path)
    expected = model.state_dict()
    assert state["model"].keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state["model"][name], value), name
    assert state["model"]["lm_head.weight"] is state["model"]["wte.weight"]
    assert state["spec"] == dataclasses.asdict(model.spec) and state["config"]["arch"]["name"] == "gpt2"


def test_pruning_takes_both_files_and_stale_temps(compose, tmp_path):
    save_run(compose, tmp_path, steps=(1,))
    folder = ckpt.checkpoint_dir(tmp_path)
    (folder / ".step_00000002.safetensors.tmp9-ab").write_bytes(b"left by a killed write")
    save_run(compose, tmp_path, steps=(2, 3), keep=2)
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000002.pt", "step_00000002.safetensors",
                                                        "step_00000003.pt", "step_00000003.safetensors"]


def test_a_run_with_only_safetensors_weights_loads_the_same_model(compose, tmp_path):
    save_run(compose, tmp_path, steps=(2, 3), arch="rwkv7")
    x = torch.randint(0, 16, (1, 12), generator=torch.Generator().manual_seed(0))
    from_pt, _ = load_run(tmp_path, device="cpu")
    for pt in ckpt.checkpoint_dir(tmp_path).glob("*.pt"):
        pt.unlink()  # shared without pickles
    from_safetensors, _ = load_run(tmp_path, device="cpu")
    assert from_safetensors.checkpoint_step == 3 and from_safetensors.checkpoint_path.suffix == ".safetensors"
    with torch.no_grad():
        assert torch.equal(from_pt(x), from_safetensors(x))
    assert load_run(tmp_path, step=2, device="cpu")[0].checkpoint_step == 2
    newest = ckpt.checkpoint_dir(tmp_path) / "step_00000003.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])  # cut short
    with pytest.raises(RunError, match=r"^checkpoint weights .*step_00000003\.safetensors are unreadable \("):
        load_run(tmp_path, step=3, device="cpu")


def test_a_checkpoint_without_safetensors_loads_as_before(compose, tmp_path):
    model = save_run(compose, tmp_path)
    ckpt.weights_path(ckpt.checkpoint_dir(tmp_path) / "step_00000003.pt").unlink()  # written by an older longctx
    loaded, _ = load_run(tmp_path, device="cpu")
    assert loaded.checkpoint_path.suffix == ".pt"
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
