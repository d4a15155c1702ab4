"""power: gated power attention, A_ij = (s q_i.k_j)^p exp(G_i - G_j) (the math: longctx.kernels.power.reference;
kernels in longctx.kernels)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from longctx.kernels import (PowerState, default_chunk_size, power_attention, power_attention_step,  # CUDA -> Triton,
                             power_decode_step, state_dim, symmetric_power_indices)                   # CPU -> reference
from longctx.kernels.power import context_parallel_power_attention

from ..context_parallel import ContextParallel
from .registry import boolean, int_in, positive_int, register
from .shared import HeadGate, doc_starts, mean_keys_per_query


@register("power")
class PowerAttention(nn.Module):
    """Gated power attention of degree p with per-head gating.

    Even p: normalized by the sum of attention weights (the paper's choice; (q.k)^p >= 0).
    Odd p (1, 3): (q.k)^p has no sign, so the sum can vanish; we use the unnormalized form (norm=False) and
    RMS-normalize each head's output instead (as FLA's GLA/RetNet do with their group norm).
    `output_norm=true` adds that per-head RMSNorm after even p too (the power-attention authors' training code
    normalizes each head's output).
    Decoding keeps the constant-size recurrent state (`PowerState`, D x d per head) of the kernels' step API.
    Context parallel: the gated states of the slices before this one, all-gathered
    (kernels.power.context_parallel_power_attention).
    """

    context_parallel: ContextParallel | None = None  # set by models.context_parallel.set_context_parallel

    @dataclass(frozen=True)
    class Params:
        p: int = 2                          # degree
        chunk_size: Optional[int] = None    # None = the kernel's choice (attention form short, chunked long)
        gating: bool = True                 # per-head learned forget gate
        output_norm: bool = False           # RMSNorm over each head's output (odd p always have it)

        def __post_init__(self):
            int_in(self, "p", 1, 4, "power attention supports integer degrees 1..4")
            positive_int(self, "chunk_size", allow_none=True)
            boolean(self, "gating")
            boolean(self, "output_norm")

    def __init__(self, spec, params: Params):
        super().__init__()
        self.p, self.chunk_size = params.p, params.chunk_size
        self.n_heads, self.head_dim = spec.n_heads, spec.head_dim
        self.norm = self.p % 2 == 0
        self.gate = HeadGate(spec.d_model, spec.n_heads) if params.gating else None
        self.out_norm = nn.RMSNorm(spec.head_dim, eps=1e-6) if params.output_norm or not self.norm else None

    def forward(self, q, k, v, x, doc_ids=None):
        """doc_ids (b, t) int: packed documents: a gate that forgets everything at each document's first token."""
        log_g = self.gate(x) if self.gate is not None else None  # (b, t, h) fp32 <= 0
        if doc_ids is not None:
            log_g = document_gates(log_g, doc_ids, k.shape[2])
        y = self._checked(self.core, q, k, v, log_g)                # (b, t, h, d)
        return y if self.out_norm is None else self.out_norm(y)

    def core(self, q, k, v, log_g):
        if self.context_parallel is not None:
            return self.context_parallel_core(q, k, v, log_g)
        return power_attention(q, k, v, log_g, p=self.p, chunk_size=self.chunk_size, norm=self.norm)

    def context_parallel_core(self, q, k, v, log_g):
        # the ranks run one model on equal slices, so they agree on shapes and arguments: no check collective
        return context_parallel_power_attention(q, k, v, log_g, p=self.p, chunk_size=self.chunk_size, norm=self.norm,
                                                group=self.context_parallel.group, check_group=False)

    def decode(self, q, k, v, x, state: PowerState | StaticPowerState | None):
        if isinstance(state, StaticPowerState):  # one token into the preallocated state (decoding.StaticDecoder)
            # the gate's input and parameters, not its output: the fused kernel computes the gate itself
            gate = None if self.gate is None else (x, self.gate.weight, self.gate.bias)
            y = state.step(q, k, v, None, p=self.p, norm=self.norm, scale=self.head_dim ** -0.5, gate=gate)
            return (y if self.out_norm is None else self.out_norm(y)), state
        log_g = self.gate(x) if self.gate is not None else None
        y, state = self._checked(power_attention_step, q, k, v, state, log_g, p=self.p, norm=self.norm)
        return (y if self.out_norm is None else self.out_norm(y)), state

    def _checked(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as err:  # e.g. a head_dim the CUDA kernels do not take: say which attention asked
            raise ValueError(f"{type(self).__name__} (p={self.p}, head_dim={self.head_dim}): {err}") from err

    def static_state(self, state: PowerState, pos, capacity: int) -> StaticPowerState:
        """The prompt's final state as buffers that decoding updates in place (constant size: no capacity)."""
        return StaticPowerState(state, self.p)

    @property
    def expanded_dim(self) -> int:  # D = C(d + p - 1, p), the symmetric power's dimension
        return state_dim(self.p, self.head_dim)

    def state_size(self, ctx):  # per head: the D x d state, plus the D normalizer when normalized
        return self.n_heads * self.expanded_dim * (self.head_dim + int(self.norm))

    def state_flops(self, ctx):  # per token: read the state (query) and write it (key-value update)
        return 2 * 2 * self.state_size(ctx)

    def forward_flops(self, ctx, device_type="cuda", dtype=torch.bfloat16):
        """Forward state FLOPs per token, one layer, of the form the kernels run at `ctx` on `device_type` with
        `dtype` inputs (the chunk length the kernels' `default_chunk_size` picks, or this core's own)."""
        return self.form_flops(ctx, self.block_length(ctx, device_type, dtype))

    def kernel_chunk(self, ctx, device_type="cuda", dtype=torch.bfloat16):
        """The chunk the kernels run this core with at `ctx` on `device_type` with `dtype` inputs (its own, or the one
        `default_chunk_size` picks); None: the attention form (on a CPU, the quadratic reference)."""
        return self.chunk_size or default_chunk_size(ctx, self.p, self.head_dim, device_type == "cuda", dtype)

    def block_length(self, ctx, device_type="cuda", dtype=torch.bfloat16) -> int:
        """Tokens of each block the form at `ctx` runs: ctx for the attention form, the chunk for the chunked form
        (kernel_chunk)."""
        chunk = self.kernel_chunk(ctx, device_type, dtype)
        return ctx if chunk is None or chunk >= ctx else chunk

    def form_flops(self, ctx, chunk):
        """The attention form (chunk None, or one chunk covering ctx): q.k and A.v over the causal keys, like softmax
        attention; the chunked form: that attention inside each chunk of `chunk` tokens plus the state's query and
        update (state_flops)."""
        attention = 2 * 2 * self.n_heads * self.head_dim  # q.k and A.v: d multiply-adds per key each
        if chunk is None or chunk >= ctx:
            return float(attention * mean_keys_per_query(ctx, ctx))
        return float(attention * mean_keys_per_query(chunk, chunk) + self.state_flops(ctx))


BOUNDARY_LOG_G = -80.0  # the log-gate at a document's first token: e^-80 ~ 2e-35 of the state before it survives.
# Finite, not -inf: G_i - G_j of two tokens past a boundary must stay a difference of finite numbers (no inf - inf),
# and small enough that cumulative gates of many documents keep their fp32 resolution.


def document_gates(log_g, doc_ids, heads: int):
    """log_g (b, t, h) fp32 or None (ungated) -> the same with BOUNDARY_LOG_G at each document's first token (a
    document's own first gate only ever decays what came before it, so nothing within it changes)."""
    if log_g is None:
        log_g = torch.zeros(*doc_ids.shape, heads, device=doc_ids.device)
    return torch.where(doc_starts(doc_ids)[..., None], torch.full_like(log_g, BOUNDARY_LOG_G), log_g)


class StaticPowerState:
    """A PowerState's buffers, s (b, hk, D, d) and z (b, hk, D) fp32, updated in place one token at a time by
    `power_decode_step` (CUDA: the fused kernel, one launch a layer; CPU: plain torch ops; the same in a CUDA graph or
    compiled), with the gather indices of phi. fused=False: the plain-torch step on CUDA too (benchmarks compare
    the two)."""

    def __init__(self, state: PowerState, p: int, fused: bool = True):
        cdt = torch.float64 if state.s.dtype == torch.float64 else torch.float32
        self.s, self.z = state.s.to(cdt).contiguous(), state.z.to(cdt).contiguous()  # the fused kernel's layout
        index, self.weight = symmetric_power_indices(p, self.s.shape[-1], self.s.device)
        self.index = index.to(torch.int32)                      # int32: the kernel's gather offsets, and torch's index
        self.weight = self.weight.to(cdt)
        self.ticket = torch.zeros(self.s.shape[0] * self.s.shape[1], dtype=torch.int32, device=self.s.device)
        self.fused = fused

    def step(self, q, k, v, log_g, *, p: int, norm: bool, scale: float, gate: tuple | None = None):
        """q (b, 1, hq, d), k, v (b, 1, hk, d), log_g (b, 1, hk) fp32 or None -> y (b, 1, hq, d) in q's dtype; or gate
        (x (b, 1, d_model), weight (hk, d_model), bias (hk,)) in place of log_g (power_decode_step)."""
        return power_decode_step(self.s, self.z, self.index, self.weight, self.ticket, q, k, v, log_g, p, norm, scale,
                                 fused=self.fused, gate=gate)

    def nbytes(self) -> int:
        return (self.s.numel() + self.z.numel()) * self.s.element_size()
