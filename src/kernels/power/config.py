"""Switches of the attention form (parallel.py) and of the generic chunked form (chunk.py), each one frozen config
read at launch time; `override` replaces one for the calls inside a `with` block (A/B runs, tests):

    from longctx.kernels.power import config
    with config.attention.override(gate_scores=False):
        ...

The p=2 state kernels have their own (chunk_p2/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ._config import ConfigSlot


@dataclass(frozen=True)
class AttentionConfig:
    """The attention form's kernels (also the chunked form's intra-chunk attention)."""
    fast_forward: bool = True     # off-diagonal key blocks without mask or per-element exp (_attn_fwd)
    fast_backward: bool = True    # ... in the backward kernels
    rowsum_mma: bool = True       # the forward's normalizer row sums by a matmul with ones (4k fwd 0.758 -> 0.629 ms)
    gate_scores: bool = True      # the key gate factor multiplies the scores (False: folded into k; equal speed)
    block_override: dict = field(default_factory=dict)   # {"fwd"|"dkdv"|"dq"|"bwd": (BM, BN, warps, stages[, regs])}
    short_fwd_t: int = 2048       # the forward at t <= short_fwd_t (d=64, bf16) takes short_fwd_block:
    short_fwd_block: tuple = (64, 64, 4, 3)   # 1k 0.093 -> 0.082 ms, 2k 0.240 -> 0.234; 4k stays (0.753 vs 0.809)


@dataclass(frozen=True)
class ChunkConfig:
    """The generic chunked form (expand-MMA state kernels, every p)."""
    discumsum_block: int = 1024   # elements of the flattened state per _discumsum program
    max_grid_y: int = 65535       # CUDA's limit on grid dims 1 and 2: intra-chunk launches split the chunk-batch to fit


attention = ConfigSlot(AttentionConfig())
chunk = ConfigSlot(ChunkConfig())
