"""CUDA dispatch: which implementation runs a power-attention call on CUDA tensors.

Status (docs/kernels.md): the Triton attention form (forward + backward, every p/d/dtype/gating/GQA
combination) runs every call without a recurrent state. Calls that carry a state (initial_state /
return_state, the decoding path) or force the chunked form (chunk_size set) run the PyTorch reference on
CUDA: correct, differentiable, but materializing the expanded features (memory ~ t * D per head).
"""
from __future__ import annotations

from .reference import power_attention_reference
from .triton_attention import attention_form


def cuda_chunk_size(t: int, p: int, d: int):
    """Default form on CUDA: the attention form for every length until the chunked kernels land."""
    return None


def power_attention_cuda(q, k, v, log_g, *, p, scale, chunk_size, norm, initial_state, return_state):
    if chunk_size is None and initial_state is None and not return_state:
        d = q.shape[-1]
        return attention_form(q, k, v, log_g, p=p, scale=d ** -0.5 if scale is None else scale, norm=norm)
    return power_attention_reference(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, norm=norm,
                                     initial_state=initial_state, return_state=return_state)
