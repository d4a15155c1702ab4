"""Thresholds and switches of the attention form (parallel.py), the chunked forms' shared stages (chunk.py,
chunk_stages.py), the gate scan (gates.py) and the routing (dispatch.py), each a frozen config read at launch time;
`override` replaces one for the calls inside a `with` block (A/B runs, tests). The kernels' tiles are rows of the
tunables table (tunables.py): block_override replaces them, and a field that is a tile defaults to its row. Fields are
thresholds, tile overrides or switches with a runtime reason; an alternative that lost its measurement is deleted
(docs/kernels.md keeps its numbers):

    from longctx.kernels.power import config
    with config.attention.override(offdiag_fp32_grads=True):
        ...

The p=2 state kernels have their own (chunk_p2/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import tunables
from ._config import ConfigSlot


@dataclass(frozen=True)
class AttentionConfig:
    """The attention form's kernels (also the chunked form's intra-chunk attention)."""
    # {"fwd"|"dkdv"|"dq"|"bwd": (BM, BN, warps, stages[, regs])} over the tunables table's rows
    block_override: dict = field(default_factory=dict)
    short_fwd_t: int = 2048       # the forward at t <= short_fwd_t takes the table's attn_fwd_short tile (d=64, bf16)
    # the backward's off-diagonal dS tiles and gate-scaled keys in fp32 instead, bf16 gated calls: d(log g) at the
    # input floor too (0.35%), but the attention form's fwd+bwd 3-5x slower at 1k-8k (tf32x3), ~2x (tf32)
    offdiag_fp32_grads: bool = False
    offdiag_precision: str = "tf32x3"   # those fp32 tiles' matmuls: "tf32x3" (fp32-exact) or "tf32" (one pass)
    # the attention form's backward as one kernel over key blocks with dq by fp32 atomics (5 tile matmuls, not 7 in
    # two kernels; fwd+bwd 4k 2.812 -> 2.732 ms, 16k 38.7 -> 36.8, H100); off, or torch's deterministic mode (the
    # atomic adds' order varies, and with it dq's last bits): the two kernels
    fused_backward: bool = True
    # ... its dq adds as one bulk tensor reduction per tile (TMA: sm_90+ only, the interpreter has none) instead of
    # relaxed per-element atomics; off: fwd+bwd 4k 2.728 -> 2.715 ms, 1k 0.307 -> 0.315 (within the host's noise
    # there), H100, `python -m tools.ab_switch --ctxs 1024,4096 --rounds 7 --variants default tma_dq=1`
    tma_dq: bool = False

    def __post_init__(self):
        if self.offdiag_precision not in ("tf32x3", "tf32", "ieee"):
            raise ValueError(f"offdiag_precision={self.offdiag_precision!r}: expected 'tf32x3', 'tf32' or 'ieee'")


@dataclass(frozen=True)
class ChunkConfig:
    """The chunked forms' shared stages (chunk_stages.py: the scan over chunks, the intra-chunk launches)."""
    discumsum_block: int = tunables.tile("discumsum", 64)[0]   # elements of the flattened state per _discumsum program
    max_grid_y: int = 65535       # CUDA's limit on grid dims 1 and 2: intra-chunk launches split the chunk-batch to fit


@dataclass(frozen=True)
class GatesConfig:
    """The gate scan both forms run first (gates.py)."""
    column_tile: int = tunables.tile("segment_cumsum", 64)[0]   # steps per tile of a column program


@dataclass(frozen=True)
class DispatchConfig:
    """Which form a stateless call with chunk_size=None runs (dispatch.py), and the chunk it gets. Crossings measured
    fwd+bwd, b=8, h=12, bf16, H100 unless noted (tools/bench_forms.py, tools/ab_switch.py), chunked / attention form
    ms. The chunked form pads t to whole chunks, so a t just past a multiple of the chunk pays for one more whole
    chunk."""
    chunked_min_t: int = 6144          # p=2, d=64, any t: 4864 4.35 / 3.86, 6144 4.46 / 6.05 (chunk 512); H200:
    #                                    5376 4.12 / 3.93, 5888 4.51 / 4.68
    # ... t a multiple of the chunk (no zero-padded tail), H200: 4608 3.21-3.35 / 2.96 (two runs), 5120 3.26 / 3.58,
    # 5632 3.51 / 4.28, 6144 3.88 / 5.08 (H100, before the attention form's flushing exps and unmasked tiles: 4608
    # 3.37 / 3.52)
    chunked_min_t_aligned: int = 5120
    chunked_min_t_wide: int = 16384    # p=2, d=128: 8k 57.4 / 32.3, 16k 116.5 / 128.4
    chunked_min_t_linear: int = 4096   # p=1: 2k 3.47 / 0.89, 4k 1.88 / 2.70, 8k 3.52 / 9.15
    default_chunk: int = 1024          # chunk when the caller gives none (512 and 2048 within 3%)
    chunk_p2: int = 512                # ... for p=2 on the bf16 state kernels at d <= 64 (64k 52.69 -> 50.46 ms)


attention = ConfigSlot(AttentionConfig())
dispatch = ConfigSlot(DispatchConfig())
gates = ConfigSlot(GatesConfig())
chunk = ConfigSlot(ChunkConfig())
