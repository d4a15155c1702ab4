"""The Triton forms as torch.library custom ops, for torch.compile.

Dynamo cannot trace the kernels' Python launch code (tables, caches, grids), so under torch.compile a call would
split the graph around every attention layer. As custom ops each pass is one opaque node with a shape-only fake:
the graph stays whole and the compiler fuses the code around the layer. Eager calls keep the autograd Functions
(triton_attention.AttentionForm, triton_chunked.ChunkedForm): a custom op costs extra host time per call, which
short sequences feel. Only stateless calls go through here (no initial_state / return_state).

Each form has a forward op returning the output and the tensors its backward needs, and a backward op; the pair
is joined by register_autograd. Optional tensors (log_g) are Optional[Tensor]; a missing gradient comes back as
an empty tensor and is turned into None.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import gates, triton_chunked, triton_sym2
from .reference import state_dim
from .triton_attention import attention_backward, attention_forward

_F32 = torch.float32


# ----------------------------------------------------------------------------------------------------------
# attention form
@torch.library.custom_op("longctx::power_attention_form_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: Optional[torch.Tensor], scale: float,
                   p: int, norm: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    o, lse, G = attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), log_g, scale, p, norm)
    # the unread 1-element dummies are uninitialized (no fill launch in eager); an op's outputs must be
    # deterministic (opcheck compares eager with traced runs)
    return o, lse if norm else lse.zero_(), G if log_g is not None else G.zero_()


@_attention_fwd.register_fake
def _(q, k, v, log_g, scale, p, norm):
    b, t, hq, _ = q.shape
    lse = q.new_empty((b, t, hq) if norm else (1,), dtype=_F32)
    G = q.new_empty((b, t, k.shape[2]) if log_g is not None else (1,), dtype=_F32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), lse, G


@torch.library.custom_op("longctx::power_attention_form_bwd", mutates_args=())
def _attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: torch.Tensor,
                   o: torch.Tensor, lse: torch.Tensor, scale: float, p: int, norm: bool,
                   gated: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dlog_g = attention_backward(do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), G, o,
                                            lse, scale, p, norm, gated)
    return dq, dk, dv, dlog_g if gated else q.new_empty(0, dtype=_F32)


@_attention_bwd.register_fake
def _(do, q, k, v, G, o, lse, scale, p, norm, gated):
    dlog_g = G.new_empty(G.shape if gated else (0,))
    return (*(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)), dlog_g)


def _attention_setup(ctx, inputs, output):
    q, k, v, log_g, scale, p, norm = inputs
    o, lse, G = output
    ctx.save_for_backward(q, k, v, G, o, lse)
    ctx.cfg = (scale, p, norm, log_g is not None)


def _attention_grad(ctx, do, _dlse, _dG):
    q, k, v, G, o, lse = ctx.saved_tensors
    scale, p, norm, gated = ctx.cfg
    dq, dk, dv, dlog_g = _attention_bwd(do, q, k, v, G, o, lse, scale, p, norm, gated)
    return dq, dk, dv, dlog_g if gated else None, None, None, None


_attention_fwd.register_autograd(_attention_grad, setup_context=_attention_setup)


def attention_form_op(q, k, v, log_g, scale: float, p: int, norm: bool) -> torch.Tensor:
    """triton_attention.attention_form as custom ops (same semantics)."""
    return _attention_fwd(q, k, v, log_g, scale, p, norm)[0]


# ----------------------------------------------------------------------------------------------------------
# chunked form (stateless; t a multiple of the chunk C: chunked_form pads before calling)
@torch.library.custom_op("longctx::power_chunked_form_fwd", mutates_args=())
def _chunked_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: Optional[torch.Tensor], scale: float,
                 p: int, norm: bool, C: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                     torch.Tensor]:
    gl = None if log_g is None else gates.segment_scan(log_g, C)                    # chunk-local G
    y, S, Z, lse, G, _ = triton_chunked.chunked_forward(q.contiguous(), k.contiguous(), v.contiguous(), gl, None,
                                                        None, scale, p, norm, C)
    return y, S, Z, lse, G.clone() if G is lse else G      # ungated and not norm: one dummy; op outputs may not alias


@_chunked_fwd.register_fake
def _(q, k, v, log_g, scale, p, norm, C):
    b, T, hq, d = q.shape
    d = int(d)                                    # the head dim is static (kernel constexpr); state_dim caches
    hk, ds = k.shape[2], state_dim(p, d)
    low = triton_sym2.applies(p, d, q.dtype) and q.dtype == torch.bfloat16     # bf16 states (chunked_forward)
    S = q.new_empty((b, hk, T // C + 1, ds, d), dtype=torch.bfloat16 if low else _F32)
    Z = q.new_empty((b, hk, T // C + 1, ds), dtype=_F32)
    lse = q.new_empty((b, T, hq) if norm else (1,), dtype=_F32)
    G = q.new_empty((b, T, hk) if log_g is not None else (1,), dtype=_F32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), S, Z, lse, G


@torch.library.custom_op("longctx::power_chunked_form_bwd", mutates_args=())
def _chunked_bwd(dy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: torch.Tensor,
                 S: torch.Tensor, Z: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, scale: float, p: int,
                 norm: bool, gated: bool, C: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    parallel = triton_chunked.PARALLEL_STATE or S.dtype == torch.bfloat16          # as chunked_forward chose
    # the final state is not an output here: its gradients are None (zeros in the kernels' slot)
    dq, dk, dv, dgl, _, _ = triton_chunked.chunked_backward(dy, None, None, q.contiguous(), k.contiguous(),
                                                            v.contiguous(), G, S, Z, y, lse, scale, p, norm, gated,
                                                            C, False, parallel)
    dlog_g = gates.segment_scan(dgl, C, reverse=True) if gated else q.new_empty(0, dtype=_F32)
    return dq, dk, dv, dlog_g


@_chunked_bwd.register_fake
def _(dy, q, k, v, G, S, Z, y, lse, scale, p, norm, gated, C):
    dlog_g = G.new_empty(G.shape if gated else (0,))
    return (*(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)), dlog_g)


def _chunked_setup(ctx, inputs, output):
    q, k, v, log_g, scale, p, norm, C = inputs
    y, S, Z, lse, G = output
    ctx.save_for_backward(q, k, v, G, S, Z, y, lse)
    ctx.cfg = (scale, p, norm, log_g is not None, C)


def _chunked_grad(ctx, dy, *_unused):
    q, k, v, G, S, Z, y, lse = ctx.saved_tensors
    scale, p, norm, gated, C = ctx.cfg
    dq, dk, dv, dlog_g = _chunked_bwd(dy, q, k, v, G, S, Z, y, lse, scale, p, norm, gated, C)
    return dq, dk, dv, dlog_g if gated else None, None, None, None, None


_chunked_fwd.register_autograd(_chunked_grad, setup_context=_chunked_setup)


def chunked_form_op(q, k, v, log_g, scale: float, p: int, norm: bool, C: int) -> torch.Tensor:
    """triton_chunked.ChunkedForm (stateless) with the chunk-local gate scan, as custom ops; t % C == 0."""
    return _chunked_fwd(q, k, v, log_g, scale, p, norm, C)[0]
