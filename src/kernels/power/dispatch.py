"""CUDA dispatch: which implementation runs a power-attention call on CUDA tensors.

Status (docs/kernels.md): the Triton attention form (forward + backward, every p/d/dtype/gating/GQA
combination) runs every call without a recurrent state. Calls that carry a state (initial_state /
return_state, the decoding path) or force the chunked form (chunk_size set) run the PyTorch reference on
CUDA: correct, differentiable, but materializing the expanded features (memory ~ t * D per head).

Opt-in: `LONGCTX_POWER_IMPL=chunked` (read at each call) routes those calls to the Triton chunked kernels
(triton_chunked.py; verified under TRITON_INTERPRET=1 only, not yet on a GPU), and makes `chunk_size=None`
pick the chunked form with chunk CHUNKED_DEFAULT_C for t >= CHUNKED_MIN_T and p <= 2. Unset (or `auto`):
the behaviour above. Both thresholds are unmeasured guesses until the GPU benchmark sets them.
"""
from __future__ import annotations

import os

from .reference import power_attention_reference
from .triton_attention import attention_form

IMPL_ENV = "LONGCTX_POWER_IMPL"
CHUNKED_MIN_T = 8192        # opt-in only: chunked form from this length (p <= 2)
CHUNKED_DEFAULT_C = 1024    # opt-in only: chunk length when the caller gives none


def _chunked_opt_in() -> bool:
    impl = os.environ.get(IMPL_ENV, "auto")
    if impl not in ("auto", "chunked"):
        raise ValueError(f"{IMPL_ENV}={impl!r}: expected 'auto' or 'chunked'")
    return impl == "chunked"


def cuda_chunk_size(t: int, p: int, d: int):
    """Default form on CUDA: the attention form for every length, unless the chunked kernels are opted in."""
    if _chunked_opt_in() and p <= 2 and t >= CHUNKED_MIN_T:
        return CHUNKED_DEFAULT_C
    return None


def power_attention_cuda(q, k, v, log_g, *, p, scale, chunk_size, norm, initial_state, return_state):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if chunk_size is None and initial_state is None and not return_state:
        return attention_form(q, k, v, log_g, p=p, scale=scale, norm=norm)
    if _chunked_opt_in():
        from .triton_chunked import chunked_form
        return chunked_form(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size or CHUNKED_DEFAULT_C,
                            norm=norm, initial_state=initial_state, return_state=return_state)
    return power_attention_reference(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, norm=norm,
                                     initial_state=initial_state, return_state=return_state)
