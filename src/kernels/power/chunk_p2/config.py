"""Tuning of the p=2 state kernels: the switches and pipeline depths of one frozen `P2Config`, read at each launch;
their tiles are rows of the tunables table (tunables.py: sym2_*, gluon_*, transpose_heads, norm_*), which the tile
fields here default to and block_override replaces. A/B runs and tests replace it for a while:

    from longctx.kernels.power.chunk_p2 import config
    with config.override(outer_stages=3, qbwd_pipe=3):
        ...

The measurements behind each default are in docs/kernels.md (design decisions, which also keeps the numbers of the
alternatives that lost and were deleted); a number here is H100, b=8, h=12,
d=64, bf16, t=64k, fwd+bwd unless it says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import tunables
from .._config import ConfigSlot

TILE2 = 8          # the p = 2 tile (reference.state_tile(2, d) for d in 32, 64, 128)

GLUON_OUTER_DIMS = (32, 64, 128)      # head dims the Gluon outer products run for
_ROWS = {kind: tunables.tile(f"gluon_{name}_rows", 64, "bf16")
         for kind, name in (("qfwd", "query_fwd"), ("qbwd", "query_bwd"), ("kdv", "key_dv"), ("kdk", "key_dk"))}


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
    # {kernel: entry} over the table's sym2_<kernel> rows ("outer": also the Gluon outer products' (JG, rows)):
    # sweeps (tools/tune_sym2.py)
    block_override: dict = field(default_factory=dict)
    grouped_qbwd_min_d: int = 128     # the query backward grouped from this d on, row-scaled below (d=128 16k: grouped
    #                                   15.7 ms, row-scaled 19.1)
    qfwd_pipe: int = 3                # slice prefetch stages of the Triton row kernels (query fwd 8.87 -> 7.25 ms)
    kdv_pipe: int = 3                 # (key dv 9.50 -> 7.29 ms)
    qbwd_pipe: int = 4                # (query bwd 20.5 / 18.0 / 10.8 / 10.4 ms at 0 / 2 / 3 / 4)
    transpose_block: tuple = tunables.tile("transpose_heads", 64)   # _transpose_heads: (time rows per program, warps)
    outer_stages: int = 4             # the Gluon outer products' cp.async ring (3: 14.1 ms, 2: 20.2 against 12.7 at 4)
    outer_scan_regs: int = 168        # register cap of the scanning launches (0: none; 202 uncapped: 2 programs/SM)
    qfwd_block: tuple = _ROWS["qfwd"][:3]    # the Gluon row kernels' (rows, warps, ring slots) ...
    qbwd_block: tuple = _ROWS["qbwd"][:3]
    kdv_block: tuple = _ROWS["kdv"][:3]
    kdk_block: tuple = _ROWS["kdk"][:3]
    qfwd_regs: int = _ROWS["qfwd"][3]        # ... and register caps (0: none)
    qbwd_regs: int = _ROWS["qbwd"][3]
    kdv_regs: int = _ROWS["kdv"][3]
    kdk_regs: int = _ROWS["kdk"][3]
    window_min: int = 16              # narrowest slice window of the forward-type row kernels (0: half_window):
    #                                   key dv 4.15 -> 4.03 ms at 16
    norm_sums_bk: int = 64            # rows per _norm_chunk_sums step (both scans 0.78 ms; 128: 0.81, 32: 0.86)
    norm_sums_rows: int = 1024        # rows per _norm_chunk_sums program (whole chunks)
    norm_scan_ahead: int = 1          # _norm_scan loads the next chunk's inputs before adding this one's


slot = ConfigSlot(P2Config())
current = slot.current
override = slot.override
