"""Pieces every architecture shares: rotary embeddings, the per-token loss head, FLOP/state accounting."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .attention import HeadGate
from .attention.shared import doc_starts
from .decoding import LayerCache, generate


@functools.cache
def _fla_cross_entropy():
    """FLA's fused cross-entropy (Triton, CUDA): fp32 math on the bf16 logits, per-row losses. Imported on first
    CUDA use: importing FLA takes seconds, which every CPU command (a config error, evaluate, generate) would pay."""
    try:
        from fla.modules.fused_cross_entropy import cross_entropy_loss
    except ImportError:  # pragma: no cover - FLA is a dependency; a broken install falls back to torch
        return None
    return cross_entropy_loss


def token_shift(x, prev=None, doc_ids=None):
    """(b, t, c) -> x_{t-1} - x_t, with x_{-1} = prev (b, c): the previous call's last token when decoding, else 0.
    RWKV's token shift (Peng et al. 2023); FLA's Triton op on CUDA. doc_ids (b, t): packed documents, each
    document's first token sees 0 before it, as at position 0."""
    if doc_ids is not None:
        return torch.where(doc_starts(doc_ids)[..., None], -x, token_shift(x, prev))
    if prev is not None:
        return torch.cat([prev[:, None].to(x.dtype), x[:, :-1]], dim=1) - x
    if x.is_cuda:
        from fla.modules.token_shift import token_shift as fla_token_shift
        return fla_token_shift(x)
    return F.pad(x, (0, 0, 1, -1)) - x


def cached_token_shift(x, cache, key: str, doc_ids=None):
    """token_shift of x; when decoding (`cache`: the layer's LayerCache) it continues from the token the cache kept
    under `key`, and keeps x's last token there for the next call. doc_ids: packed documents (token_shift)."""
    if cache is None:
        return token_shift(x, doc_ids=doc_ids)
    delta = token_shift(x, cache.shift.get(key))
    if cache.static:  # the buffer a CUDA graph reads: written in place
        cache.shift[key].copy_(x[:, -1])
    else:
        cache.shift[key] = x[:, -1].clone()
    return delta


# ----------------------------------------------------------------------------------------------------------
# packed documents: `doc_ids` (b, t) numbers the documents of each row (non-decreasing along a row); a packed row's
# outputs equal those of its documents run one by one

def doc_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(b, t) int64: each token's position within its document."""
    idx = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand(doc_ids.shape)
    return idx - torch.where(doc_starts(doc_ids), idx, 0).cummax(1).values


def model_positions(doc_ids, t: int, d: int, base: float, start, device):
    """The rotary tables a model hands its layers: positions start.. (rotary_tables), or with doc_ids the positions
    within each document."""
    if doc_ids is None:
        return rotary_tables(t, d, base, start, device)
    return rotary_tables_at(doc_positions(doc_ids), d, base)


# ----------------------------------------------------------------------------------------------------------
# rotary position embedding (Su et al. 2021, "RoFormer"), rotate-half convention as in GPT-NeoX / Llama

def rotary_tables(t: int, d: int, base: float, offset: int | torch.Tensor = 0,
                  device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (t, d/2) fp32 of positions offset..offset+t-1. A model computes them once per forward and hands
    them to every layer: computed inside a compiled block instead, they are fused into the rotation and cost a
    cos and a sin per query and key element (measured: 18% of a GPT-2 small step at 64k). offset may be a 0-dim
    integer tensor on `device` (static decoding: the position lives on the device, read by a CUDA graph)."""
    inv_freq = base ** -(torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)  # (d/2,)
    if isinstance(offset, torch.Tensor):
        positions = offset.float() + torch.arange(t, device=device, dtype=torch.float32)
    else:
        positions = torch.arange(offset, offset + t, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)                                           # (t, d/2)
    return angles.cos(), angles.sin()


def rotary_tables_at(positions: torch.Tensor, d: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (b, t, d/2) fp32 of per-row positions (b, t) (packed documents: positions within each document)."""
    inv_freq = base ** -(torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)  # (d/2,)
    angles = positions.float()[..., None] * inv_freq                                    # (b, t, d/2)
    return angles.cos(), angles.sin()


def rotary(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate (b, t, h, d) queries or keys by the positions of `tables` (rotary_tables(t, r, ...), r even, r <= d,
    or rotary_tables_at's per-row (b, t, r/2)): the first r dims are rotated, the rest pass unchanged (partial
    rotary, as in GPT-NeoX)."""
    r = 2 * tables[0].shape[-1]
    lead = (slice(None), slice(None)) if tables[0].dim() == 3 else (None, slice(None))
    cos = tables[0][(*lead, None)].to(x.dtype)                                            # (1 or b, t, 1, r/2)
    sin = tables[1][(*lead, None)].to(x.dtype)
    x1, x2 = x[..., : r // 2], x[..., r // 2: r]
    turned = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    return torch.cat(turned if r == x.shape[-1] else turned + [x[..., r:]], dim=-1)


# ----------------------------------------------------------------------------------------------------------
# language-model head: per-token next-token NLL, chunked over tokens so long contexts never hold all logits

def _nll(h, weight, targets):
    logits = F.linear(h, weight)  # (n, vocab), bf16 under autocast
    fused = _fla_cross_entropy() if logits.is_cuda and logits.dtype != torch.float64 else None
    if fused is not None:
        # one pass over the logits in fp32 registers, the gradient written over them: torch's fp32 copy,
        # log-softmax and its backward cost ~20% of a GPT-2 small step (bench_train --profile, docs/models.md)
        return fused(logits, targets, inplace_backward=True)[0]
    return F.cross_entropy(logits.float(), targets, reduction="none")


def per_token_nll(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  chunk_tokens: int = 8192) -> torch.Tensor:
    """NLL of `targets` under logits = hidden @ weight.T, without reduction.

    hidden (b, t, d), weight (vocab, d), targets (b, t) int64 -> (b, t) float32. The cross-entropy runs in fp32
    (on CUDA FLA's fused kernel, on the logits' own dtype; elsewhere torch on an fp32 copy).
    More than `chunk_tokens` tokens are processed in chunks whose logits are recomputed in the backward
    (activation checkpointing), so peak memory holds one chunk's logits instead of (b*t, vocab) — the role
    FLA's FusedLinearCrossEntropyLoss plays, but keeping the per-position losses the ICL curve needs.
    """
    b, t, d = hidden.shape
    h, y = hidden.reshape(b * t, d), targets.reshape(b * t)
    if b * t <= chunk_tokens:
        return _nll(h, weight, y).view(b, t)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    out = []
    for i in range(0, b * t, chunk_tokens):
        hi, yi = h[i:i + chunk_tokens], y[i:i + chunk_tokens]
        out.append(checkpoint(_nll, hi, weight, yi, use_reentrant=False) if grad else _nll(hi, weight, yi))
    return torch.cat(out).view(b, t)


def compile_disabled(fn):
    """torch.compiler.disable(fn), applied only while torch.compile traces: the decorator imports torch._dynamo
    (~2.5 s), which every command importing the models (a `--help`, a config error) would otherwise pay."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            return torch.compiler.disable(fn)(*args, **kwargs)
        return fn(*args, **kwargs)
    return wrapper


@compile_disabled  # a backward pass inside the forward: trainer.compile=model breaks its graph here
def nll_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            chunk_tokens: int = 8192) -> torch.Tensor:
    """per_token_nll(hidden, weight, targets).sum() (a float32 scalar), for training: with gradients wanted, each
    chunk's gradients of hidden and weight are formed in the forward while its logits exist, and the backward only
    scales them by the incoming gradient. per_token_nll's backward instead recomputes every chunk's logits and
    cross-entropy, because a per-token loss may be weighted token by token (measured: ~8% of a GPT-2 small step)."""
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        return per_token_nll(hidden, weight, targets, chunk_tokens).sum()
    return _NLLSum.apply(hidden, weight, targets, chunk_tokens)


class _NLLSum(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens):
        b, t, d = hidden.shape
        h, y = hidden.detach().reshape(b * t, d), targets.reshape(b * t)
        w = weight.detach().requires_grad_()
        dh = torch.empty_like(h)
        dw = torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, torch.float32))  # summed over chunks
        total = torch.zeros((), device=h.device, dtype=torch.float32)
        for i in range(0, b * t, chunk_tokens):
            hi = h[i:i + chunk_tokens].requires_grad_()
            with torch.enable_grad():
                loss = _nll(hi, w, y[i:i + chunk_tokens]).sum()
                dhi, dwi = torch.autograd.grad(loss, (hi, w))
            dh[i:i + chunk_tokens] = dhi
            dw += dwi
            total += loss.detach()
        ctx.save_for_backward(dh.view(b, t, d), dw)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad):
        dh, dw = ctx.saved_tensors
        return dh * grad.to(dh.dtype), (dw * grad).to(ctx.weight_dtype), None, None


LOSS_REDUCTIONS = ("none", "sum")


def loss_head(hidden, weight, targets, reduction: str = "none") -> torch.Tensor:
    """The models' loss: per-token NLL (b, t) fp32 (reduction="none") or its sum (reduction="sum", the trainer's:
    no recomputation in the backward, see nll_sum)."""
    if reduction == "none":
        return per_token_nll(hidden, weight, targets)
    if reduction == "sum":
        return nll_sum(hidden, weight, targets)
    raise ValueError(f"reduction={reduction!r}: expected one of {LOSS_REDUCTIONS}")


# ----------------------------------------------------------------------------------------------------------
# accounting (docs/architecture.md): forward FLOPs per token split into weight and state, state size

def weight_flops_per_token(model: nn.Module) -> float:
    """2 FLOPs per multiply-add of an activation with a parameter: every Linear (the tied LM head included,
    the embedding lookup not) and every per-head gate. Elementwise work (norms, activations) is not counted."""
    n = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, HeadGate)):
            n += m.weight.numel()
    return 2.0 * n


def state_cores(model: nn.Module):
    """The modules that hold state (attention cores, RWKV7 time mixing): those with state_size/state_flops."""
    return [m for m in model.modules() if hasattr(m, "state_size") and hasattr(m, "state_flops") and m is not model]


class LanguageModelMixin:
    """flops_per_token / state_size / generate for any architecture built from Linear layers and state cores
    whose forward takes `cache` (a list of per-layer `LayerCache`, from `new_cache()`)."""

    def _init_weights(self, module):
        """GPT-2's init (`self.apply` it): Linear and Embedding N(0, 0.02), residual projections (`.residual`) scaled
        by 1/sqrt(2 * n_layers), biases zero; attention cores initialise their own parameters (e.g. gate biases)."""
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.spec.n_layers) if getattr(module, "residual", False) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def residual_blocks(self) -> nn.ModuleList:  # what trainer.compile=blocks and checkpointing act on
        return self.blocks

    def first_position(self, t: int, cache) -> int:
        """The position of the first of t input tokens: the decoding cache's, or this rank's slice start under
        context parallelism (models.context_parallel), else 0."""
        start = 0 if cache is None else cache[0].pos
        if getattr(self, "context_parallel", None) is not None:
            if cache is not None:
                raise ValueError("cache: decoding runs in one process (set_context_parallel(model, None) first)")
            start = self.context_parallel.start(t)
        return start

    def run_blocks(self, x, rope, cache=None, doc_ids=None):
        """x through every block: with the decoding caches, with activation checkpointing when asked, else plainly."""
        for i, block in enumerate(self.blocks):
            if cache is not None:
                x = block(x, rope, cache[i])
            elif self.spec.checkpoint_activations and torch.is_grad_enabled():
                x = checkpoint(block, x, rope, None, doc_ids, use_reentrant=False)
            else:
                x = block(x, rope, doc_ids=doc_ids)
        return x

    def head(self, x, targets=None, last_only=False, reduction="none"):
        """Logits (b, t or n, vocab), or with targets the per-token NLL (b, t) fp32 or its sum (see forward)."""
        if targets is None:
            return self.lm_head(x[:, -int(last_only):] if last_only else x)
        return loss_head(x, self.lm_head.weight, targets, reduction)

    def new_cache(self) -> list:
        """Empty decoding caches, one per layer, for `forward(input_ids, cache=...)`."""
        return [LayerCache() for _ in range(self.spec.n_layers)]

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 use_cache: bool = True, generator: torch.Generator | None = None, static: bool = True,
                 compile: bool | None = None) -> torch.Tensor:
        """Continue idx (b, t) by max_new_tokens sampled tokens -> (b, t + max_new_tokens). See decoding.generate
        (static=True: preallocated decoding buffers and, on CUDA, one CUDA graph per step; compile: that step
        compiled first, None = on CUDA where torch.compile is available)."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache,
                        generator=generator, static=static, compile=compile)

    def flops_per_token(self, ctx: int) -> dict:
        return {"weight": weight_flops_per_token(self),
                "state": float(sum(core.state_flops(ctx) for core in state_cores(self)))}

    def state_size(self, ctx: int) -> int:
        return int(sum(core.state_size(ctx) for core in state_cores(self)))
