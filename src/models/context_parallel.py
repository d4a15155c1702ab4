"""Context parallelism (CP) inside a model: each document split along time into N equal slices, one per rank of a
process group, every rank running the whole model on its slice. Only what reads other positions needs the other
ranks, and each attention core gets its own exact exchange (docs/gpu.md (Context parallelism)):

    exp     all-gather of keys and values; queries of slice r attend to the keys of slices 0..r, causal mask
            aligned to the end (a query at local position i sits at global position r*t + i)
    window  a halo: the window-1 keys and values before the slice (from one or more earlier ranks), all-gathered
    power   the states of the earlier slices, all-gathered and gated (kernels.power.context_parallel)
    linear  the same as power, p=1 (the power kernel, also on CUDA where FLA's kernel runs without CP)
    rotary  positions start at r*t; GPT-2's token shift reads the previous rank's last token (a halo of 1)

Everything else (projections, MLP, norms, loss) acts token by token. RWKV7 is not supported.

`set_context_parallel(model, cp)` puts one `ContextParallel` on the model and its cores; None restores the
one-process behaviour exactly. The exchanges are differentiable (_AllGather: its backward returns the gradient of a
gathered tensor, summed over the ranks that read it, to the rank that sent it).
A collective's backward must run on every rank of the group, so a rank whose output does not read what it gathered
(rank 0 reads no halo) ties the gathered tensors to its output with zero gradient (`tie`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from longctx.kernels.power import differentiable_all_gather, tie

CP_KEY = "trainer.context_parallel"  # the config key errors name


@dataclass(frozen=True)
class ContextParallel:
    """The ranks that share one document: `group` (a torch.distributed process group of `world` ranks), this rank's
    place `rank` in it. Slices are equal: a slice of t tokens starts at global position rank * t."""
    group: object
    rank: int
    world: int

    def start(self, t: int) -> int:
        return self.rank * t


def all_gather_slices(x: torch.Tensor, cp: ContextParallel) -> list[torch.Tensor]:
    """Every rank's x (same shape on every rank), in rank order; differentiable."""
    if torch.is_grad_enabled() and x.requires_grad:
        return differentiable_all_gather(x.contiguous(), cp.group)
    parts = [torch.empty_like(x) for _ in range(cp.world)]
    dist.all_gather(parts, x.contiguous(), group=cp.group)
    return parts


def gather_prefix(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """x (b, t, ...) of slices 0..rank, concatenated along time: (b, (rank + 1) t, ...); differentiable."""
    return torch.cat(all_gather_slices(x, cp)[:cp.rank + 1], dim=1)


def halo(x: torch.Tensor, n: int, cp: ContextParallel) -> torch.Tensor:
    """The n tokens of x (b, t, ...) right before this rank's slice, (b, min(n, rank * t), ...): from one or more
    earlier ranks when n > t. Each rank sends its last min(n, t) tokens. Differentiable."""
    t = x.shape[1]
    if n == 0:  # a window of 1 (every rank alike): nothing to exchange
        return x[:, :0]
    tails = all_gather_slices(x[:, t - min(n, t):], cp)
    if cp.rank == 0:
        empty = x[:, :0]
        return tie(empty, *tails) if torch.is_grad_enabled() and tails[0].requires_grad else empty
    ranks = math.ceil(n / t)  # earlier slices the halo reaches into
    return torch.cat(tails[max(0, cp.rank - ranks):cp.rank], dim=1)[:, -n:]


@torch.no_grad()
def gather_context(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """x (b, t, ...) of every rank concatenated along time, (b, world * t, ...): the whole documents (no gradient)."""
    return torch.cat(all_gather_slices(x, cp), dim=1)


def context_slice(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """This rank's slice of x (b, T, ...) along time (T divisible by the world)."""
    t = x.shape[1] // cp.world
    return x[:, cp.start(t):cp.start(t) + t]


def set_context_parallel(model: nn.Module, cp: ContextParallel | None) -> nn.Module:
    """Put `cp` on the model and on every part that reads other positions (None: one process). Refuses, naming
    trainer.context_parallel, an architecture or attention that has no exact split."""
    if cp is not None and "context_parallel" not in vars(type(model)):
        raise ValueError(f"{CP_KEY}={cp.world}: arch={model.spec.arch} has no context-parallel form (its recurrence "
                         f"runs over the whole sequence in one process); use arch=gpt2 or {CP_KEY}=1")
    if cp is not None:
        # the cores: common.state_cores' test (common imports the cores, which import this module)
        for core in (m for m in model.modules() if m is not model and hasattr(m, "state_size")):
            if not hasattr(core, "context_parallel"):
                raise ValueError(f"{CP_KEY}={cp.world}: attention={model.spec.attention} has no context-parallel "
                                 f"form; use {CP_KEY}=1")
    for module in model.modules():
        if hasattr(type(module), "context_parallel"):
            module.context_parallel = cp
    return model


class ContextParallelModel(nn.Module):
    """Evaluation over CP ranks: takes whole documents (b, T), runs the model on this rank's slice, and returns what
    the model returns on the whole documents (per-token NLL (b, T), or logits (b, T, vocab)) on every rank."""

    def __init__(self, model: nn.Module, cp: ContextParallel):
        super().__init__()
        self.model, self.cp = model, cp

    def forward(self, input_ids, targets=None, **kwargs):
        if kwargs.get("reduction", "none") != "none" or kwargs.get("cache") is not None:
            raise ValueError("ContextParallelModel: per-token outputs of whole documents only (no reduction, cache)")
        targets = None if targets is None else context_slice(targets, self.cp)
        out = self.model(context_slice(input_ids, self.cp), targets, **kwargs)
        return gather_context(out, self.cp)
