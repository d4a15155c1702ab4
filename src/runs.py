"""Trained runs as models: `load_run(run_dir)` -> (model, cfg) from the newest (or a given) checkpoint.

    from longctx import load_run
    model, cfg = load_run("runs/gpt2_power_p2_tiny_icl_markov_ctx128_s0")
    out = model.generate(prompt_ids, max_new_tokens=50, temperature=0)

The model is rebuilt from the run's own config (the one saved in the checkpoint, else `<run_dir>/config.yaml`)
exactly as the trainer built it (`models.spec.model_spec`), so configs written before the attention parameters
moved into the core load unchanged: their conf/attention keys are the core's parameters; keys newer than a
config take their defaults. Checkpoints are read by train/checkpoint.py (no code runs; the newest unreadable one is
skipped with a warning when no step is asked for).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from longctx.models import build_model
from longctx.models.spec import model_spec
from longctx.train import checkpoint as ckpt

log = logging.getLogger("longctx")


class RunError(ValueError):
    """A run directory that cannot give a model: missing, without checkpoints, or with a config that no longer
    builds one. The message names the path and what is wrong."""


def pick_checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path, dict]:
    """(step, path, state) of the asked step, or of the newest readable checkpoint (skipped ones said once each)."""
    if not run_dir.is_dir():
        raise RunError(f"run directory {str(run_dir)!r} does not exist")
    found = ckpt.list_checkpoints(run_dir)
    if not found:
        raise RunError(f"{run_dir} holds no checkpoint (looked in {ckpt.checkpoint_dir(run_dir)}); a run writes one "
                       f"at every evaluation (trainer.eval_every)")
    try:
        if step is None:
            return ckpt.read_newest(found, ("model",), log.warning)
        for s, path in found:
            if s == step:
                return s, path, ckpt.read(path, ("model",))
    except ckpt.CheckpointError as err:
        raise RunError(str(err)) from None
    raise RunError(f"step={step}: {run_dir} has no checkpoint of that step; it has steps "
                   f"{', '.join(str(s) for s, _ in found)}")


def run_config(run_dir: Path, state: dict) -> DictConfig:
    """The config the checkpoint was trained with (saved inside it), else the run directory's config.yaml."""
    if state.get("config") is not None:
        return OmegaConf.create(state["config"])
    path = run_dir / "config.yaml"
    if not path.exists():
        raise RunError(f"{run_dir}: neither the checkpoint nor the directory (config.yaml) holds the run's config")
    try:
        cfg = OmegaConf.load(path)  # YAML's safe subset
    except Exception as err:  # yaml's parser errors, a directory, ...
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise RunError(f"{path}: not a readable config ({first})") from None
    if not isinstance(cfg, DictConfig):
        raise RunError(f"{path}: not a config (a YAML mapping)")
    return cfg


def vocab_size_of(state: dict) -> int:
    """The model's vocabulary: the checkpoint's spec, else the embedding's rows."""
    spec = state.get("spec") or {}
    if "vocab_size" in spec:
        return int(spec["vocab_size"])
    for name in ("wte.weight", "embeddings.weight"):
        if name in state["model"]:
            return int(state["model"][name].shape[0])
    raise RunError("the checkpoint records no vocabulary size and has no embedding to read it from")


def load_run(run_dir: str | Path, step: int | None = None, device: str | torch.device = "auto"):
    """Load a trained run -> (model, cfg).

    Args:
        run_dir: the run's directory (holding checkpoints/ and config.yaml).
        step: the checkpoint's training step; None = the newest.
        device: "auto" (CUDA when available), "cpu", "cuda", or a torch.device.
    Returns:
        (model in eval mode on `device`, the run's config as a DictConfig). `model.checkpoint_step` is the step
        loaded and `model.checkpoint_path` its file.
    Raises:
        RunError (a ValueError) naming the path: missing directory, no checkpoint, a step that is not there, a
        checkpoint that cannot be read (none readable when no step is asked for), a config that no longer builds a
        model (e.g. an attention that no longer exists, a required key missing).
    """
    run_dir = Path(run_dir).expanduser()
    step, path, state = pick_checkpoint(run_dir, step)
    cfg = run_config(run_dir, state)
    try:
        spec = model_spec(cfg, vocab_size_of(state))
    except ValueError as err:
        raise RunError(f"{run_dir}: its config does not build a model: {err}") from err
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(spec)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:  # names or shapes that the config's model does not have
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        raise RunError(f"{path}: its weights do not fit the model its config builds ({first})") from None
    model = model.to(device).eval()
    model.checkpoint_step, model.checkpoint_path = step, path
    return model, cfg
