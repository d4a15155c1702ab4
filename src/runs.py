"""Trained runs as models: `load_run(run_dir)` -> (model, cfg) from the newest (or a given) checkpoint.

    from longctx import load_run
    model, cfg = load_run("runs/gpt2_power_p2_d64l3_icl_markov_ctx128_s0")
    out = model.generate(prompt_ids, max_new_tokens=50, temperature=0)

The model is rebuilt from the run's own config (the one saved in the checkpoint, else `<run_dir>/config.yaml`)
exactly as the trainer built it (`models.spec.model_spec`), so configs written before the attention parameters
moved into the core load unchanged: their conf/attention keys are the core's parameters; keys newer than a
config take their defaults. Checkpoints are read by train/checkpoint.py (no code runs; the newest unreadable one is
skipped with a warning when no step is asked for). A checkpoint that is not the run's model (copied in from another
run: its config differs from config.yaml in a key that defines the model, or its weights from the model built) or
whose weights are not finite is refused, naming the file and the key or tensor: evaluate and generate load through
here. A step kept only as its safetensors weights (checkpoints/step_XXXXXXXX.safetensors, a run folder shared without
its pickled checkpoints) loads from them; where both files are there the .pt is read. A checkpoint holding objects a
weights-only load refuses is one line naming the file and the global torch names (train.checkpoint), never torch's
advice to load it unsafely. `check_data_tokens`: a split's ids mean what the run's ids meant when it trained
(evaluate and the harness read a run's data through it).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from longctx.models import build_model
from longctx.models.spec import model_spec
from longctx.train import checkpoint as ckpt
from longctx.train.resume import MODEL_GROUPS, MODEL_SHORTCUTS, classify, config_changes

log = logging.getLogger("longctx")


class RunError(ValueError):
    """A run directory that cannot give a model: missing, without checkpoints, or with a config that no longer
    builds one. The message names the path and what is wrong."""


def pick_checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path, dict]:
    """(step, path, state) of the asked step, or of the newest readable checkpoint (skipped ones said once each)."""
    if run_dir.exists() and not run_dir.is_dir():
        parent = f"; its folder {str(run_dir.parent)!r} is a run" if (run_dir.parent / "checkpoints").is_dir() else ""
        run = run_dir.parent.parent
        step_of = {p.name: s for s, p in ckpt.list_checkpoints(run)} if run_dir.parent.name == "checkpoints" else {}
        if run_dir.name in step_of:  # <run>/checkpoints/step_N.pt: the run and the step that pick it
            parent = f"; it is a checkpoint of the run {str(run)!r}: name the run, with --step {step_of[run_dir.name]}"
        raise RunError(f"run directory {str(run_dir)!r} is a file, not a run folder{parent}")
    if not run_dir.is_dir():
        raise RunError(f"run directory {str(run_dir)!r} does not exist")
    found = ckpt.list_checkpoints(run_dir)
    # steps kept only as safetensors weights (a run folder shared without its pickled checkpoints)
    pt_steps = {s for s, _ in found}
    weights_only = [(s, p) for s, p in ckpt.list_weights(run_dir) if s not in pt_steps]
    if not found and not weights_only:
        runs = sorted(p.name for p in run_dir.iterdir() if (p / "checkpoints").is_dir())
        inside = (f"; it holds {len(runs)} run folder{'s' * (len(runs) != 1)} ({', '.join(runs[:3])}"
                  f"{', ...' if len(runs) > 3 else ''}): name one of them" if runs else "")
        raise RunError(f"{run_dir} holds no checkpoint (looked in {ckpt.checkpoint_dir(run_dir)}); a run writes one "
                       f"at every evaluation (trainer.eval_every){inside}")
    try:
        if step is None and (not weights_only or found and found[-1][0] > weights_only[-1][0]):
            return ckpt.read_newest(found, ("model",), log.warning)
        if step is None:
            step = weights_only[-1][0]
        for s, path in found:
            if s == step:
                return s, path, ckpt.read(path, ("model",))
        for s, path in weights_only:
            if s == step:
                return s, path, ckpt.read_weights(path)
    except ckpt.CheckpointError as err:
        raise RunError(str(err)) from None
    raise RunError(f"step={step}: {run_dir} has no checkpoint of that step; it has steps "
                   f"{', '.join(str(s) for s, _ in sorted(found + weights_only))}")


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


def check_run_model(run_dir: Path, path: Path, state: dict) -> None:
    """A checkpoint copied in from another run (another attention, shape, ctx): the model its saved config builds
    is not the one of the run's config.yaml. Refused naming the file and the first differing key (the keys a resume
    refuses to change that define the model: longctx.train.resume)."""
    own = run_dir / "config.yaml"
    if state.get("config") is None or not own.is_file():
        return
    try:  # as written (the trainer writes it resolved): no interpolation is resolved, none can hide a difference
        now = OmegaConf.to_container(OmegaConf.load(own), resolve=False)
    except Exception as err:  # YAML that does not parse: the checkpoint cannot be checked against it
        raise RunError(f"{own}: unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                       f"{path} cannot be checked against the run's config") from None
    if not isinstance(now, dict):
        return
    _, _, refused = classify(config_changes(state["config"], now))
    differing = {k: v for k, v in refused.items() if k.startswith(MODEL_GROUPS) or k in (*MODEL_SHORTCUTS, "ctx")}
    if differing:
        key, (theirs, ours) = next(iter(differing.items()))
        more = f"; and {len(differing) - 1} more" if len(differing) > 1 else ""
        raise RunError(f"{path}: a checkpoint of another model than {own} describes ({key}: {theirs!r} in the "
                       f"checkpoint, {ours!r} in the run{more}); it was copied in from another run?")


def check_data_tokens(run_dir: Path, split_path, recorded: dict | None, advice: str) -> None:
    """The ids of the split at `split_path` mean what the run's training ids meant: `recorded` (what the run
    recorded at its first launch, longctx.generate.recorded_tokens: tokenizer, BOS, the tokenizer file it keeps);
    another tokenizer's ids would be read as text the model never read. ValueError naming both, ending in `advice`.
    A run without a record (None) is not checked."""
    from longctx.data.identity import IDENTITY_FILE
    from longctx.data.tokenizer import describe_tokens, split_tokens, tokens_differ

    if recorded is None:
        return
    data = split_tokens(split_path)
    if tokens_differ(recorded, data):
        raise ValueError(f"data: {split_path} holds ids of {describe_tokens(data)}, but {run_dir} was trained on ids "
                         f"of {describe_tokens(recorded)}, as its {IDENTITY_FILE} records; {advice}")


def check_own_heldout(run_dir: Path, heldout_path) -> None:
    """The run's own heldout split (no data override) under the path its first launch recorded must still hold the
    documents it recorded: a dataset replaced there would be evaluated and labelled as the run's data. ValueError
    naming both digests; a run without a record, or data read from another path, is not checked."""
    from longctx.data.identity import IDENTITY_FILE, read_identity, split_identity

    try:
        recorded = read_identity(run_dir)
    except ValueError:   # a damaged record: the tokenizer check and the report say so; nothing to compare with
        return
    now_path = Path(str(heldout_path)).expanduser().resolve()
    if recorded is None or Path(str(recorded["heldout"].get("path", ""))) != now_path:
        return
    now, was = split_identity(now_path), recorded["heldout"]
    if (now["digest"], now["hashed"]) != (was.get("digest"), was.get("hashed")):
        raise ValueError(f"data: {now_path} holds other heldout documents (digest {now['digest'][:12]}) than {run_dir} "
                         f"recorded there at its first launch ({str(was.get('digest'))[:12]}, {IDENTITY_FILE}): the "
                         f"dataset was replaced; to evaluate on it anyway, name it: data.path={now_path.parent}")


def check_device(name, flag: str = "--device") -> str:
    """auto, cpu, cuda or cuda:N, and the device must exist: the name to use ("auto" resolved); `flag` names it in
    the error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{flag}={name!r}: expected auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag}={name!r}: no CUDA device is available (use {flag} cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{flag}={name!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return name if isinstance(name, str) else str(device)


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
        model (e.g. an attention that no longer exists, a required key missing), a checkpoint of another model
        than the run's, or non-finite weights.
    """
    device = check_device(device, "device")
    run_dir = Path(run_dir).expanduser()
    step, path, state = pick_checkpoint(run_dir, step)
    cfg = run_config(run_dir, state)
    try:
        spec = model_spec(cfg, vocab_size_of(state))
    except ValueError as err:
        raise RunError(f"{run_dir}: its config does not build a model: {err}") from err
    check_run_model(run_dir, path, state)
    model = build_model(spec)
    differences = ckpt.weight_differences(model.state_dict(), state["model"])
    if differences:
        raise RunError(f"{path}: its weights do not fit the model its config builds ({differences[0]}"
                       f"{f'; and {len(differences) - 1} more' if len(differences) > 1 else ''})")
    bad = ckpt.first_non_finite(state["model"])
    if bad is not None:
        raise RunError(f"{path}: non-finite weights ({bad} holds NaN or infinite values): the checkpoint is not "
                       f"usable; pick an earlier step (--step / step=)")
    model.load_state_dict(state["model"])
    model = model.to(device).eval()
    model.checkpoint_step, model.checkpoint_path = step, path
    return model, cfg
