"""AdamW with the paper's schedule: linear warmup, then cosine decay to a floor."""
from __future__ import annotations

import math

import torch
from omegaconf import DictConfig


def build_optimizer(model: torch.nn.Module, optim_cfg: DictConfig) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices (nanoGPT's convention: norms, biases and gains are not decayed)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": optim_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps)


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Learning rate at optimizer step `step` (0-based): linear warmup to `lr`, cosine to `min_lr` at max_steps."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: DictConfig, max_steps: int):
    base = optim_cfg.lr
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_at(step, lr=base, min_lr=optim_cfg.min_lr, warmup_steps=optim_cfg.warmup_steps,
                           max_steps=max_steps) / base,
    )
