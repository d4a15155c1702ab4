"""CUDA dispatch: which implementation runs a power-attention call on CUDA tensors.

Routing (thresholds in config.dispatch; docs/kernels.md has the measurements behind them):
* a stateless call with `chunk_size=None`: the Triton chunked form (chunk: default_chunk) when it is the
  faster one -- t >= min_chunked_t(d) and either p = 1 (state of d x d: cheap at any dtype) or p = 2 with bf16
  inputs (the p=2 state kernels of chunk_p2/) -- else the Triton attention form (quadratic, fastest at short
  t; the faster form for p >= 3 and for p = 2 in fp16/fp32, where only the generic chunked kernels exist);
* `chunk_size` set, `initial_state`, `return_state`, decoding: the Triton chunked kernels (chunk.py;
  every p, dtype, GQA, gating, state in/out; GPU-tested).

`LONGCTX_POWER_IMPL` (read at each call) overrides the choice for stateless calls: `auto` (default, above),
`chunked` (the chunked form at every t, for every p <= 2 and dtype: for A/B timing), `attention` (always the
attention form), or `reference` (every CUDA call runs the PyTorch reference: a debugging aid, slow and
memory-hungry).
"""
from __future__ import annotations

import os

from . import config
from .autograd import attention_form, chunked_form
from .chunk_p2 import applies as p2_applies
from .reference import power_attention_reference

IMPL_ENV = "LONGCTX_POWER_IMPL"
IMPLS = ("auto", "chunked", "attention", "reference")


def _impl() -> str:
    impl = os.environ.get(IMPL_ENV, "auto")
    if impl not in IMPLS:
        raise ValueError(f"{IMPL_ENV}={impl!r}: expected one of {IMPLS}")
    return impl


def min_chunked_t(p: int, d: int) -> int:
    """Shortest t at which the chunked form is the default (stateless calls)."""
    cfg = config.dispatch.current()
    if p == 1:
        return cfg.chunked_min_t_linear
    return cfg.chunked_min_t_wide if p == 2 and d >= 128 else cfg.chunked_min_t


def default_chunk(p: int, d: int, dtype=None) -> int:
    """The chunk length of every CUDA call that gives none (stateless or with a state): config.dispatch's chunk_p2
    for the p=2 family (chunk_p2.applies) at d <= 64, else its default_chunk."""
    cfg = config.dispatch.current()
    if d <= 64 and dtype is not None and p2_applies(p, d, dtype):
        return cfg.chunk_p2
    return cfg.default_chunk


def cuda_chunk_size(t: int, p: int, d: int, dtype=None):
    """Chunk length for a stateless CUDA call with chunk_size=None, or None for the attention form."""
    impl = _impl()
    if impl in ("attention", "reference"):
        return None
    if impl == "chunked" and p <= 2:
        return default_chunk(p, d, dtype)
    if t < min_chunked_t(p, d):
        return None
    if p == 1 or (dtype is not None and p2_applies(p, d, dtype)):
        return default_chunk(p, d, dtype)
    return None


def power_attention_cuda(q, k, v, log_g, *, p, scale, chunk_size, norm, initial_state, return_state):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if _impl() == "reference":
        return power_attention_reference(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, norm=norm,
                                         initial_state=initial_state, return_state=return_state)
    if chunk_size is None and initial_state is None and not return_state:
        return attention_form(q, k, v, log_g, p=p, scale=scale, norm=norm)
    chunk_size = chunk_size or default_chunk(p, q.shape[-1], q.dtype)
    return chunked_form(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size,
                        norm=norm, initial_state=initial_state, return_state=return_state)
