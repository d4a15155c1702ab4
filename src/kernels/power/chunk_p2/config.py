"""Tuning of the p=2 state kernels: block tables (constants, measured per head dim) and the switches of one frozen
`P2Config`, read at each launch. A/B runs and tests replace it for a while:

    from longctx.kernels.power.chunk_p2 import config
    with config.override(outer_stages=3, qbwd_pipe=3):
        ...

The measurements behind each default are in docs/kernels.md (design decisions, which also keeps the numbers of the
alternatives that lost and were deleted); a number here is H100, b=8, h=12,
d=64, bf16, t=64k, fwd+bwd unless it says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._config import ConfigSlot

TILE2 = 8          # the p = 2 tile (reference.state_tile(2, d) for d in 32, 64, 128)

# kernel -> (JG, rows per program or step, warps, stages[, maxnreg]) of the Triton kernels (tools/tune.py sweeps)
BLOCKS = {
    "outer": (2, 32, 4, 3),           # outer product 23.1 -> 21.7 ms against the H200 sweep's entry
    "qbwd": (2, 64, 4, 3),
    "kbwd": (2, 64, 4, 2),            # dk only (dv row-scaled); with dv too (2, 64, 4, 1) was best
    "qfwd_rows": (1, 64, 4, 1, 128),  # capped at 128 registers: 4 programs per SM (10.45 -> 8.93 ms)
    "kdv_rows": (1, 128, 4, 1, 168),  # 128 rows with the dv accumulated on the tensor cores (6.60 -> 6.23 ms)
    "qbwd_rows": (1, 64, 4, 1, 168),  # 3 programs per SM (12.6 ms uncapped, 11.2 at 160, 10.4 at 168, 13.5 at 184)
}
BLOCKS_WIDE = {    # d = 128: the best per kernel of a t=16k sweep (fwd+bwd 190.0 -> 116.9 ms)
    "outer": (1, 32, 4, 3),
    "qbwd": (1, 128, 8, 2),
    "kbwd": (1, 64, 4, 2),
    "qfwd_rows": (1, 64, 8, 3),
    "kdv_rows": (1, 64, 4, 2),        # t=16k: 14.6 ms; (1, 64, 8, 3) 14.8
    "qbwd_rows": (1, 64, 8, 1),
}
BLOCKS_NARROW = {  # d <= 32: entries that differ from BLOCKS
    "qbwd_rows": (1, 64, 4, 1, 128),  # 3.33 ms capped at 128 registers, 3.80 at 168; grouped 3.58
    "kdv_rows": (1, 128, 4, 1, 128),  # 2.16 ms (2.37 at 168)
}
GLUON_OUTER_DIMS = (32, 64, 128)      # head dims the Gluon outer products run for
GLUON_OUTER_BLOCK = {32: (2, 64), 64: (2, 64), 128: (1, 32)}   # (JG, rows per step): d=64 (2, 64) 8.68 ms, (2, 32)
#                                                                9.57; d=128 (1, 32) 66.1, (1, 16) 85.2 (H200)
NORM_SCAN_BI = 16          # rows of the dense normalizer per _norm_scan program
NORM_SUMS_WARPS = 4        # _norm_chunk_sums' warps at d <= 64 (d = 128: 8)
NORM_SUMS_STAGES = 3


@dataclass(frozen=True)
class P2Config:
    """Tunables of the p=2 state kernels (tuples of a Gluon row kernel: rows per program, warps, cp.async ring slots)
    and the switches with a runtime reason: enabled / force (which dtypes run these kernels), atomic_rmw
    (reproducible backward updates) and concurrent_bwd (off: one stream, each kernel alone, as profilers need)."""
    enabled: bool = True              # False: p = 2 runs the generic expand-MMA kernels (chunk.py)
    force: bool = False               # run these kernels for every dtype (the interpreter tests run them in fp32)
    atomic_rmw: bool = True           # dq / dk of the grouped backward by relaxed atomics (key bwd 27.8 -> 24.9 ms);
    #                                   False, or torch deterministic mode: barrier + read-modify-write, reproducible
    concurrent_bwd: bool = True       # the backward's two independent chains on two streams (8k 7.50 -> 7.40 ms)
    block_override: dict = field(default_factory=dict)   # {kernel: entry} over BLOCKS* ("outer": also the Gluon
    #                                                      outer products' (JG, rows)): sweeps (tools/tune_sym2.py)
    grouped_qbwd_min_d: int = 128     # the query backward grouped from this d on, row-scaled below (d=128 16k: grouped
    #                                   15.7 ms, row-scaled 19.1)
    qfwd_pipe: int = 3                # slice prefetch stages of the Triton row kernels (query fwd 8.87 -> 7.25 ms)
    kdv_pipe: int = 3                 # (key dv 9.50 -> 7.29 ms)
    qbwd_pipe: int = 4                # (query bwd 20.5 / 18.0 / 10.8 / 10.4 ms at 0 / 2 / 3 / 4)
    transpose_block: tuple = (64, 4)  # _transpose_heads: (time rows per program, warps)
    outer_stages: int = 4             # the Gluon outer products' cp.async ring (3: 14.1 ms, 2: 20.2 against 12.7 at 4)
    outer_scan_regs: int = 168        # register cap of the scanning launches (0: none; 202 uncapped: 2 programs/SM)
    qfwd_block: tuple = (128, 8, 8)   # two warpgroups share each slice: 64k fwd+bwd 56.41 -> 55.47 ms
    qbwd_block: tuple = (64, 4, 4)    # 128 rows: 10.22 ms against 9.43
    kdv_block: tuple = (128, 8, 8)
    kdk_block: tuple = (64, 4, 8)     # 8 slots for two slices per barrier (bwd_step)
    qfwd_regs: int = 128              # register caps (0: none): query fwd 6.38 -> 6.22 ms (152: 6.47)
    qbwd_regs: int = 168              # query bwd 9.64 -> 9.36
    kdv_regs: int = 128               # key dv 5.58 -> 4.75
    kdk_regs: int = 0                 # key dk at 168: 9.82 -> 10.85, so none
    bwd_step: tuple = (1, 2)          # slices per cp.async wait (query bwd, key dk): key dk 9.41 -> 8.33 ms
    window_min: tuple = (16, 0)       # narrowest slice window (forward-type, backward-type; 0: half_window):
    #                                   key dv 4.15 -> 4.03 ms at 16; the backward-type lose (8.65 -> 9.07)
    norm_sums_bk: int = 64            # rows per _norm_chunk_sums step (both scans 0.78 ms; 128: 0.81, 32: 0.86)
    norm_sums_rows: int = 1024        # rows per _norm_chunk_sums program (whole chunks)
    norm_scan_ahead: int = 1          # _norm_scan loads the next chunk's inputs before adding this one's


slot = ConfigSlot(P2Config())
current = slot.current
override = slot.override
