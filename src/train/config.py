"""Validation of the composed Hydra config: every bad value fails here, before any work, naming its key."""
from __future__ import annotations

import re

from omegaconf import DictConfig, OmegaConf

from longctx.models.attention import AttentionParamError, params_from_conf, parse_params

PRECISIONS = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
RESUME = (False, True, "auto")
WANDB_MODES = ("offline", "online", "disabled")


def _fail(key: str, value, why: str):
    raise ValueError(f"config: {key}={value!r}: {why}")


def _positive_int(cfg: DictConfig, key: str, allow_none: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(key, value, "must be a positive integer")


def _check_attention(cfg: DictConfig) -> None:
    """The attention's parameters, checked by its own core (models/attention/). The key named is the one the user
    typed: `p` for a top-level shortcut that conf/attention/<name>.yaml interpolates (p: ${p}), else attention.<key>."""
    try:
        parse_params(cfg.attention.name, params_from_conf(cfg.attention))
    except AttentionParamError as err:
        key = f"attention.{err.key}"
        if err.key in cfg.attention and OmegaConf.is_interpolation(cfg.attention, err.key):
            raw = OmegaConf.to_container(cfg.attention, resolve=False)[err.key]   # e.g. "${p}"
            shortcut = re.fullmatch(r"\$\{(\w+)\}", str(raw))
            key = shortcut.group(1) if shortcut else key
        _fail(key, err.value, err.why)


def validate(cfg: DictConfig) -> None:
    """Check the values a typo or a bad sweep can produce. Unknown keys are already refused by Hydra
    (struct mode: `Could not override 'key'`), unknown group options by Hydra's `Could not find`."""
    for key in ("ctx", "model.d_model", "model.n_layers", "model.n_heads", "model.mlp_ratio",
                "trainer.max_steps", "trainer.eval_every", "trainer.keep_checkpoints", "trainer.icl_bins",
                "data.docs_per_batch", "data.eval_docs"):
        _positive_int(cfg, key)
    for key in ("trainer.micro_docs", "trainer.num_threads", "data.reshape_block"):
        _positive_int(cfg, key, allow_none=True)
    if cfg.ctx < 2:
        _fail("ctx", cfg.ctx, "must be at least 2")
    if cfg.model.d_model % cfg.model.n_heads:
        _fail("model.d_model", cfg.model.d_model, f"must be divisible by model.n_heads={cfg.model.n_heads}")
    _check_attention(cfg)
    if cfg.device not in DEVICES:
        _fail("device", cfg.device, f"expected one of {DEVICES}")
    if cfg.trainer.precision not in PRECISIONS:
        _fail("trainer.precision", cfg.trainer.precision, f"expected one of {PRECISIONS}")
    if cfg.trainer.resume not in RESUME:
        _fail("trainer.resume", cfg.trainer.resume, "expected false, true or auto")
    if cfg.trainer.on_nonfinite not in ("stop", "skip"):
        _fail("trainer.on_nonfinite", cfg.trainer.on_nonfinite, "expected stop or skip")
    if cfg.logger.wandb.mode not in WANDB_MODES:
        _fail("logger.wandb.mode", cfg.logger.wandb.mode, f"expected one of {WANDB_MODES}")
    optim = cfg.optim
    if not optim.lr > 0:
        _fail("optim.lr", optim.lr, "must be > 0")
    if not 0 <= optim.min_lr <= optim.lr:
        _fail("optim.min_lr", optim.min_lr, f"must lie in [0, optim.lr={optim.lr}]")
    if optim.warmup_steps < 0:
        _fail("optim.warmup_steps", optim.warmup_steps, "must be >= 0")
    if optim.grad_clip is not None and optim.grad_clip <= 0:
        _fail("optim.grad_clip", optim.grad_clip, "must be > 0 or null")
    if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
        _fail("optim.betas", list(optim.betas), "expected two values in [0, 1)")
