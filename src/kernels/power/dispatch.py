"""CUDA dispatch: which implementation runs a power-attention call on CUDA tensors.

Routing (docs/kernels.md has the measurements behind the thresholds):
* a stateless call with `chunk_size=None`: the Triton chunked form (chunk CHUNKED_DEFAULT_C) when it is the
  faster one -- t >= min_chunked_t(d) and either p = 1 (state of d x d: cheap at any dtype) or p = 2 with bf16
  inputs (the grouped kernels of chunk_p2/kernels.py) -- else the Triton attention form (quadratic, fastest at short
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

from .autograd import attention_form, chunked_form
from .chunk_p2.kernels import applies as p2_applies
from .reference import power_attention_reference

IMPL_ENV = "LONGCTX_POWER_IMPL"
IMPLS = ("auto", "chunked", "attention", "reference")
CHUNKED_MIN_T = 6144        # p=2 d=64, b=8 h=12 bf16, fwd+bwd ms chunked / attention form, H100, session 22
                            # (scripts/gpu/bench_forms.py): 4k 3.84 / 3.05, 6k 5.32 / 6.18, 8k 6.99 / 10.41 (8192
                            # from session 14, 10240 from session 7). d=32 and p=1 cross earlier (docs/kernels.md)
CHUNKED_MIN_T_WIDE = 16384  # d=128, p=2 (D = 8704 features), H100 session 8 after the BLOCKS_WIDE sweep, fwd+bwd
                            # ms chunked / attention form: 8k 57.4 / 32.3, 16k 116.5 / 128.4 (32768 before the sweep)
CHUNKED_MIN_T_LINEAR = 4096  # p=1 (state d x d), same shape and card (session 8), chunked / attention form fwd+bwd
                            # ms: 2k 3.47 / 0.89, 4k 1.88 / 2.70, 8k 3.52 / 9.15 (the p=1 attention form's backward is
                            # generic, the chunked form's state kernels are plain matmuls)
CHUNKED_DEFAULT_C = 1024    # chunk length when the caller gives none (512 and 2048 measured within 3%)
CHUNKED_C_P2 = 512          # ... for p=2 on the bf16 state kernels at d <= 64 (session 28, H100, ab_switch.py, b=8
                            # h=12 d=64: 64k fwd+bwd 52.69 -> 50.46 ms, 8k 6.473 -> 6.203): half the intra-chunk
                            # attention's work for twice the chunk states, whose scans lost their per-chunk cost to
                            # coalesced stores, and whose memory the backward's in-place state gradients pay
                            # (kernels.BWD_STATES_IN_PLACE: peak 15.69 GB against 15.50 at 1024 before)


def _impl() -> str:
    impl = os.environ.get(IMPL_ENV, "auto")
    if impl not in IMPLS:
        raise ValueError(f"{IMPL_ENV}={impl!r}: expected one of {IMPLS}")
    return impl


def min_chunked_t(p: int, d: int) -> int:
    """Shortest t at which the chunked form is the default (stateless calls)."""
    if p == 1:
        return CHUNKED_MIN_T_LINEAR
    return CHUNKED_MIN_T_WIDE if p == 2 and d >= 128 else CHUNKED_MIN_T


def default_chunk(p: int, d: int, dtype=None) -> int:
    """The chunk length of a call that gives none: CHUNKED_C_P2 for p=2 on the bf16 state kernels at d <= 64, else
    CHUNKED_DEFAULT_C."""
    if p == 2 and d <= 64 and dtype is not None and p2_applies(p, d, dtype):
        return CHUNKED_C_P2
    return CHUNKED_DEFAULT_C


def cuda_chunk_size(t: int, p: int, d: int, dtype=None):
    """Chunk length for a stateless CUDA call with chunk_size=None, or None for the attention form."""
    impl = _impl()
    if impl in ("attention", "reference"):
        return None
    if impl == "chunked" and p <= 2:
        return default_chunk(p, d, dtype)
    if t < min_chunked_t(p, d):
        return None
    if p == 1:
        return CHUNKED_DEFAULT_C
    return default_chunk(p, d, dtype) if dtype is not None and p2_applies(p, d, dtype) else None


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
