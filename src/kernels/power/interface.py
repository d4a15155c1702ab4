"""Public power-attention functions: input checks, then dispatch (CUDA -> Triton, CPU -> reference)."""
from __future__ import annotations

from typing import Optional

import torch

from .plan import CUDA_HEAD_DIMS, make_plan
from .reference import PowerState, power_attention_reference, state_dim

CUDA_POWERS = (1, 2, 3, 4)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_inputs(q, k, v, log_g, p, scale, chunk_size, norm, initial_state):
    """power_attention's argument checks: raise ValueError naming the offending argument; returns (b, t, hq, hk, d)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, seq, heads, head_dim), got rank {x.dim()}")
    b, t, hq, d = q.shape
    hk = k.shape[2]
    if k.shape[0] != b or k.shape[1] != t or k.shape[3] != d:
        raise ValueError(f"k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} "
                         "in batch, seq or head_dim")
    if v.shape != k.shape:
        raise ValueError(f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)}")
    if t < 1:
        raise ValueError("q must have at least one token (seq >= 1)")
    if hk < 1 or hq % hk:
        raise ValueError(f"k heads ({hk}) must divide q heads ({hq}) (grouped-query attention)")
    allowed = _FLOAT_DTYPES + (() if q.is_cuda else (torch.float64,))
    if q.dtype not in allowed:
        raise ValueError(f"q dtype {q.dtype} not supported; use one of {allowed}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name} dtype {x.dtype} must equal q dtype {q.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"p must be a positive int, got {p!r}")
    if norm and p % 2:
        raise ValueError(f"p={p} is odd: the normalized form needs even p (use norm=False for odd p)")
    if q.is_cuda:
        if d not in CUDA_HEAD_DIMS:
            raise ValueError(f"head_dim d={d} not supported on CUDA; supported: {CUDA_HEAD_DIMS}")
        if p not in CUDA_POWERS:
            raise ValueError(f"p={p} not supported on CUDA; supported: {CUDA_POWERS}")
    elif d > 256:
        raise ValueError(f"head_dim d={d} not supported (at most 256)")
    if scale is not None and not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a float or None, got {type(scale).__name__}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if log_g is not None:
        if not isinstance(log_g, torch.Tensor):
            raise ValueError(f"log_g must be a torch.Tensor or None, got {type(log_g).__name__}")
        if tuple(log_g.shape) != (b, t, hk):
            raise ValueError(f"log_g shape {tuple(log_g.shape)} must be (batch, seq, k_heads) = {(b, t, hk)}")
        if not log_g.is_floating_point():
            raise ValueError(f"log_g must be floating point (float32), got {log_g.dtype}")
        if log_g.device != q.device:
            raise ValueError(f"log_g is on {log_g.device} but q is on {q.device}")
    if initial_state is not None:
        if not (isinstance(initial_state, tuple) and len(initial_state) == 2):
            raise ValueError("initial_state must be a PowerState(s, z) (or a tuple (s, z))")
        s, z = initial_state
        dim = state_dim(p, d)
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != (b, hk, dim, d):
            raise ValueError(f"initial_state.s must have shape (batch, k_heads, D, head_dim) = "
                             f"{(b, hk, dim, d)}, got {tuple(getattr(s, 'shape', ()))}")
        if not isinstance(z, torch.Tensor) or tuple(z.shape) != (b, hk, dim):
            raise ValueError(f"initial_state.z must have shape (batch, k_heads, D) = {(b, hk, dim)}, "
                             f"got {tuple(getattr(z, 'shape', ()))}")
        for name, x in (("initial_state.s", s), ("initial_state.z", z)):
            if not x.is_floating_point() or x.device != q.device:
                raise ValueError(f"{name} must be a floating tensor on {q.device}")
    return b, t, hq, hk, d


def default_chunk_size(t: int, p: int, d: int, on_cuda: bool, dtype=None) -> Optional[int]:
    """The form a stateless call with chunk_size=None runs for (t, p, head dim d, device, dtype): None for the
    attention form (short sequences), else the chunk length of the chunked form (its plan's chunk: plan.make_plan).
    Public so that FLOP accounting can charge the form that runs without knowing the routing.

    Example:
        >>> default_chunk_size(65536, 2, 64, on_cuda=False)      # the CPU reference chunks long sequences
        256
    """
    return make_plan(t, p, d, dtype, "cuda" if on_cuda else "cpu", compiling=False).chunk


def power_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: Optional[torch.Tensor] = None,
                    *, p: int = 2, scale: Optional[float] = None, chunk_size: Optional[int] = None,
                    norm: bool = True, initial_state: Optional[PowerState] = None, return_state: bool = False):
    """Causal power attention with optional per-head gating.

        A_ij = (scale * q_i . k_j)^p * exp(G_i - G_j)  (j <= i),  G = cumsum(log_g) over time
        y_i  = sum_j A_ij v_j / sum_j A_ij   (norm=True, even p)  or  sum_j A_ij v_j  (norm=False)

    Args:
        q: (b, t, hq, d) float16/bfloat16/float32 (float64 on CPU).
        k, v: (b, t, hk, d), same dtype; hq % hk == 0 (grouped-query attention).
        log_g: (b, t, hk) log of the per-token gate (<= 0), float32; None = no gating.
        p: power degree (1..4 on CUDA); odd p needs norm=False.
        scale: s; default 1/sqrt(d).
        chunk_size: None picks the form (attention form for short t, chunked for long t); an int forces
            the chunked form with that chunk length. Any t works.
        norm: normalize by the sum of the attention weights (default True).
        initial_state: PowerState(s (b, hk, D, d), z (b, hk, D)) from an earlier call's return_state:
            the tokens here continue that sequence.
        return_state: also return the PowerState after the last token.
    Returns:
        y (b, t, hq, d) in q's dtype, or (y, PowerState) if return_state.

    On CUDA everything runs Triton kernels: stateless calls with chunk_size=None take the attention form, or the
    chunked form for long bf16 p=2 sequences; chunk_size / states / decoding take the chunked kernels. The route is
    one plan per call (plan.make_plan; `python -m longctx.kernels.plan t=65536 p=2 d=64` prints it).
    LONGCTX_POWER_IMPL=auto|chunked|attention|reference overrides the choice.

    Example:
        >>> q = k = v = torch.randn(1, 16, 2, 32)
        >>> y = power_attention(q, k, v, p=2)          # (1, 16, 2, 32)
    """
    b, t, hq, hk, d = check_inputs(q, k, v, log_g, p, scale, chunk_size, norm, initial_state)
    if initial_state is not None:
        initial_state = PowerState(*initial_state)
    plan = make_plan(t, p, d, q.dtype, q.device.type, chunk_size=chunk_size, norm=norm,
                     state_in=initial_state is not None, state_out=return_state)
    if plan.form == "reference":       # CPU tensors, or LONGCTX_POWER_IMPL=reference
        return power_attention_reference(q, k, v, log_g, p=p, scale=scale, chunk_size=plan.chunk, norm=norm,
                                         initial_state=initial_state, return_state=return_state)
    from .dispatch import run
    return run(plan, q, k, v, log_g, scale=scale, norm=norm, initial_state=initial_state, return_state=return_state)


def power_attention_step(q, k, v, state: Optional[PowerState], log_g=None, *, p=2, scale=None, norm=True):
    """Decoding: a few new tokens (b, n, h, d) against a constant-size state; returns (y, new_state).
    `state=None` starts a fresh sequence. Same semantics as `power_attention(..., return_state=True)`."""
    return power_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=None, norm=norm,
                           initial_state=state, return_state=True)
