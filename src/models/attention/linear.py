"""linear: gated linear attention, y_i = sum_j (s q_i.k_j) exp(G_i - G_j) v_j, RMS-normalized per head."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from longctx.kernels import power_attention

from .power import PowerAttention
from .registry import boolean, positive_int, register


@register("linear")
class LinearAttention(PowerAttention):
    """Gated, normalized linear attention: power attention with p=1 (scalar per-head gate), output RMS-normed
    per head. GPU: FLA's `chunk_simple_gla` where its backward runs, else the p=1 power kernel (same math).
    Decoding: the p=1 recurrent state (D = d) of the power kernels' step API. Context parallel: the p=1 power
    kernel's state exchange (PowerAttention.context_parallel_core), on CUDA too."""

    @dataclass(frozen=True)
    class Params:
        chunk_size: Optional[int] = None    # None = the kernel's choice
        gating: bool = True                 # per-head learned forget gate

        def __post_init__(self):
            positive_int(self, "chunk_size", allow_none=True)
            boolean(self, "gating")

    def __init__(self, spec, params: Params):
        super().__init__(spec, PowerAttention.Params(p=1, chunk_size=params.chunk_size, gating=params.gating))

    def core(self, q, k, v, log_g):
        if self.context_parallel is not None:
            return self.context_parallel_core(q, k, v, log_g)
        if q.is_cuda and _fla_simple_gla_ok(q.device):
            from fla.ops.simple_gla import chunk_simple_gla
            y, _ = chunk_simple_gla(q, k, v, g=log_g, scale=self.head_dim ** -0.5)
            return y
        return power_attention(q, k, v, log_g, p=1, chunk_size=self.chunk_size, norm=False)

    def forward_flops(self, ctx, device_type="cuda", dtype=torch.bfloat16):
        """Forward state FLOPs per token of the form that runs: FLA's chunked form (chunks of FLA_CHUNK tokens, a
        d x d state) where `core` takes FLA's kernel, else (context parallel too) the p=1 power kernels' form."""
        if device_type == "cuda" and _fla_simple_gla_ok() and self.context_parallel is None:
            return self.form_flops(ctx, FLA_CHUNK)
        return super().forward_flops(ctx, device_type, dtype)


FLA_CHUNK = 64  # chunk_simple_gla's chunk length when given none


def _fla_simple_gla_ok(device=None) -> bool:
    """FLA's gated chunk backward refuses Hopper with Triton < 3.7.1 (FLA issue #640). device None: the current
    CUDA device; without CUDA here (accounting for a GPU run from a CPU machine) the Hopper cards the runs target."""
    try:
        import fla.ops.simple_gla  # noqa: F401
        import triton
    except ImportError:
        return False
    hopper = torch.cuda.get_device_capability(device)[0] == 9 if torch.cuda.is_available() else True
    version = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:3])
    return not (hopper and version < (3, 7, 1))
