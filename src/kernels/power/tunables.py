"""Every launch shape of the power kernels in one table: tiles, warps, pipeline stages and register caps, keyed by
(kernel, d, dtype) and read through `key` (`find`, `tile`: its entry) by every launch and by plan.Plan.launches.

    d      the largest head dim the row serves (None: every larger one); a call takes the row of the smallest d at or
           above its own, so rows at 64 and None read "d <= 64" and "d > 64"
    dtype  the matmul operand dtype ("bf16", "fp16", "fp32"; the attention form's fp16 backward runs fp32 operands),
           or "*" for any; at one d, a row of the call's dtype wins over a "*" row

An entry of None says the kernel has no such tile there (the launch takes its usual one). KERNELS says what each
kernel's entries hold. The numbers behind each entry are in docs/kernels.md; a number quoted here is H100, b=8, h=12,
bf16, fwd+bwd unless it says otherwise. Runtime overrides sit on top of the table, in the config objects: the
attention form's and the p=2 kernels' `block_override` replace entries for the calls inside a `with` block, and the
config fields that are tiles (chunk_p2.config's qfwd_block, transpose_block ..., config.chunk's discumsum_block,
config.gates' column_tile) default to rows here. Imports nothing of this package.
"""
from __future__ import annotations

import functools
from typing import Optional

ANY = "*"

KERNELS = {
    # attention form (parallel.py), also each chunk's own attention in the chunked forms
    "attn_fwd": "(BM, BN, warps, stages[, maxnreg]) of _attn_fwd",
    "attn_dkdv": "(BM, BN, warps, stages[, maxnreg]) of _attn_bwd_dkdv",
    "attn_dq": "(BM, BN, warps, stages[, maxnreg]) of _attn_bwd_dq",
    "attn_fwd_short": "_attn_fwd's tile at t <= config.attention.short_fwd_t (attention form only)",
    "attn_dkdv_offdiag_fp32": "_attn_bwd_dkdv's tile under config.attention.offdiag_fp32_grads",
    "intra_fwd": "_attn_fwd's tile as the chunked forms' intra-chunk attention (else attn_fwd's)",
    # generic chunked form (chunk.py): expanded state tiles of F = tile^p features
    "chunk_state": "(rows per step, value columns per state program, warps, stages), F <= 64",
    "chunk_state_wide": "the same, F > 64",
    "discumsum": "(elements of the flattened state per chunk_stages._discumsum program,)",
    "segment_cumsum": "(steps per column tile of gates._segment_cumsum,)",
    # p = 2 state kernels (chunk_p2/kernels.py); chunk_p2.config.block_override names them without 'sym2_'
    "sym2_outer": "(JG, rows, warps, stages[, maxnreg]) of _sym2_outer",
    "sym2_qbwd": "(JG, rows, warps, stages[, maxnreg]) of _sym2_query_bwd (grouped)",
    "sym2_kbwd": "(JG, rows, warps, stages[, maxnreg]) of _sym2_key_bwd",
    "sym2_qfwd_rows": "(JG, rows, warps, stages[, maxnreg]) of _sym2_query_fwd_rows",
    "sym2_kdv_rows": "(JG, rows, warps, stages[, maxnreg]) of _sym2_key_dv_rows",
    "sym2_qbwd_rows": "(JG, rows, warps, stages[, maxnreg]) of _sym2_query_bwd_rows",
    "gluon_outer": "(JG, rows per step) of gluon_outer.gluon_outer",
    "gluon_query_fwd_rows": "(rows per program, warps, cp.async ring slots, maxnreg or 0) of the Gluon row kernel",
    "gluon_query_bwd_rows": "(rows per program, warps, cp.async ring slots, maxnreg or 0)",
    "gluon_key_dv_rows": "(rows per program, warps, cp.async ring slots, maxnreg or 0)",
    "gluon_key_dk_rows": "(rows per program, warps, cp.async ring slots, maxnreg or 0)",
    "transpose_heads": "(time rows per program, warps) of _transpose_heads",
    "norm_chunk_sums": "(warps, stages) of _norm_chunk_sums",
    "norm_scan": "(rows of the dense normalizer per _norm_scan program (at most d),)",
    # decoding (decode_kernel.py)
    "decode_step": "(warps, programs per SM the split aims at) of _power_decode_step",
}

# The name of each place of an entry, as KERNELS says (an entry, or the tile a launch takes from it, may stop short of
# the last: an optional register cap; the Gluon outer product's launch adds its ring's stages to its table entry)
_ATTN = ("BM", "BN", "warps", "stages", "maxnreg")
_SYM2 = ("JG", "rows", "warps", "stages", "maxnreg")
_GLUON_ROWS = ("rows", "warps", "slots", "maxnreg")
FIELDS = {
    "attn_fwd": _ATTN, "attn_dkdv": _ATTN, "attn_dq": _ATTN, "attn_fwd_short": _ATTN, "attn_dkdv_offdiag_fp32": _ATTN,
    "intra_fwd": _ATTN,
    "chunk_state": ("rows", "cols", "warps", "stages"), "chunk_state_wide": ("rows", "cols", "warps", "stages"),
    "discumsum": ("elements",), "segment_cumsum": ("steps",),
    "sym2_outer": _SYM2, "sym2_qbwd": _SYM2, "sym2_kbwd": _SYM2, "sym2_qfwd_rows": _SYM2, "sym2_kdv_rows": _SYM2,
    "sym2_qbwd_rows": _SYM2,
    "gluon_outer": ("JG", "rows", "stages"),
    "gluon_query_fwd_rows": _GLUON_ROWS, "gluon_query_bwd_rows": _GLUON_ROWS, "gluon_key_dv_rows": _GLUON_ROWS,
    "gluon_key_dk_rows": _GLUON_ROWS,
    "transpose_heads": ("rows", "warps"), "norm_chunk_sums": ("warps", "stages"), "norm_scan": ("rows",),
    "decode_step": ("warps", "programs_per_sm"),
}

TABLE: dict[tuple, Optional[tuple]] = {
    # attention form: fixed tiles (no benchmarking autotuner). Register caps (5th entry) let more programs share an
    # SM: the chunked form's intra-chunk attention at 64k fwd 4.04 -> 3.46 ms, dq 4.43 -> 3.96; the attention form at
    # 4k 3.135 -> 3.075 ms fwd+bwd
    ("attn_fwd", 64, "bf16"): (128, 32, 4, 3, 168),
    ("attn_fwd", 64, ANY): (128, 64, 4, 4),
    ("attn_fwd", None, ANY): (128, 64, 8, 2),
    ("attn_fwd", None, "fp32"): (64, 32, 4, 1),        # fp32 operands at d=128: 4x the shared memory
    ("attn_dkdv", 64, ANY): (64, 64, 4, 3),
    ("attn_dkdv", None, ANY): (64, 64, 8, 2),
    ("attn_dkdv", None, "fp32"): (32, 32, 4, 1),
    ("attn_dq", 64, "bf16"): (64, 64, 4, 1, 128),
    ("attn_dq", 64, ANY): (64, 64, 4, 3),
    ("attn_dq", None, ANY): (64, 64, 8, 2),
    ("attn_dq", None, "fp32"): (32, 32, 4, 1),
    # 1k 0.093 -> 0.082 ms, 2k 0.240 -> 0.234; at 4k the default stays faster (0.753 vs 0.809)
    ("attn_fwd_short", 32, "bf16"): None,
    ("attn_fwd_short", 64, "bf16"): (64, 64, 4, 3),
    # its fp32 off-diagonal tiles: two stages need 247 KB of shared memory at d=128
    ("attn_dkdv_offdiag_fp32", 64, "bf16"): None,
    ("attn_dkdv_offdiag_fp32", None, "bf16"): (64, 64, 8, 1),
    # 64k, chunk 1024 (one tools/tune_sym2.py process per tile): 3.85 ms at (128, 32, 4, 3, 168) -> 3.66 here (96
    # registers, 8 bytes of stack as before: 5 programs per SM instead of 3); 3.73 at 128
    ("intra_fwd", 64, "bf16"): (64, 32, 4, 3, 96),
    # generic state kernels: not timed on a GPU; chosen so that sm_90 compiles (tools/compile_check.py) fit in shared
    # memory and spill little: 8 warps, [rows, F] expanded tiles of 4k elements (2k for fp32 operands with F = 256)
    ("chunk_state", 8, ANY): (64, 8, 8, 2),
    ("chunk_state", 16, ANY): (64, 16, 8, 2),
    ("chunk_state", 32, ANY): (64, 32, 8, 2),
    ("chunk_state", 64, ANY): (64, 64, 8, 2),
    ("chunk_state", 128, "fp32"): (32, 64, 8, 2),
    ("chunk_state", None, ANY): (64, 64, 8, 2),
    ("chunk_state_wide", None, ANY): (32, 32, 8, 2),
    ("chunk_state_wide", None, "fp32"): (16, 16, 8, 2),
    ("discumsum", None, ANY): (1024,),
    ("segment_cumsum", None, ANY): (1024,),            # float64: 8 per thread at 4 warps
    # p = 2, Triton kernels (tools/tune.py sweeps); d = 128: the best per kernel of a t=16k sweep (190.0 -> 116.9 ms)
    ("sym2_outer", 64, ANY): (2, 32, 4, 3),            # outer product 23.1 -> 21.7 ms against the H200 sweep's entry
    ("sym2_outer", None, ANY): (1, 32, 4, 3),
    ("sym2_qbwd", 64, ANY): (2, 64, 4, 3),
    ("sym2_qbwd", None, ANY): (1, 128, 8, 2),
    ("sym2_kbwd", 64, ANY): (2, 64, 4, 2),             # dk only (dv row-scaled); with dv too (2, 64, 4, 1) was best
    ("sym2_kbwd", None, ANY): (1, 64, 4, 2),
    ("sym2_qfwd_rows", 64, ANY): (1, 64, 4, 1, 128),   # capped at 128 registers: 4 programs per SM (10.45 -> 8.93 ms)
    ("sym2_qfwd_rows", None, ANY): (1, 64, 8, 3),
    ("sym2_kdv_rows", 32, ANY): (1, 128, 4, 1, 128),   # 2.16 ms (2.37 at 168)
    ("sym2_kdv_rows", 64, ANY): (1, 128, 4, 1, 168),   # 128 rows with the dv on the tensor cores (6.60 -> 6.23 ms)
    ("sym2_kdv_rows", None, ANY): (1, 64, 4, 2),       # t=16k: 14.6 ms; (1, 64, 8, 3) 14.8
    ("sym2_qbwd_rows", 32, ANY): (1, 64, 4, 1, 128),   # 3.33 ms capped at 128 registers, 3.80 at 168; grouped 3.58
    ("sym2_qbwd_rows", 64, ANY): (1, 64, 4, 1, 168),   # 3 programs per SM (12.6 ms uncapped, 10.4 at 168, 13.5 at 184)
    ("sym2_qbwd_rows", None, ANY): (1, 64, 8, 1),
    # p = 2, Gluon kernels: d=64 (2, 64) 8.68 ms, (2, 32) 9.57; d=128 (1, 32) 66.1, (1, 16) 85.2 (H200)
    ("gluon_outer", 16, "bf16"): None,                # not run (nor at d > 128): the Triton outer product's
    ("gluon_outer", 32, "bf16"): (2, 64),
    ("gluon_outer", 64, "bf16"): (2, 64),
    ("gluon_outer", 128, "bf16"): (1, 32),
    # two warpgroups share each slice: 64k 56.41 -> 55.47 ms; register caps: query fwd 6.38 -> 6.22 ms (152: 6.47)
    ("gluon_query_fwd_rows", None, "bf16"): (128, 8, 8, 128),
    # the backward-type over the symmetric completion as the forward: 64k query bwd 6.52, key dk 5.99 ms (an earlier
    # form: fwd+bwd 43.96 ms; uncapped 46.76, (64, 4, 8) 47.74)
    ("gluon_query_bwd_rows", None, "bf16"): (128, 8, 8, 128),
    ("gluon_key_dv_rows", None, "bf16"): (128, 8, 8, 128),     # cap: 5.58 -> 4.75 ms
    ("gluon_key_dk_rows", None, "bf16"): (128, 8, 8, 128),
    ("transpose_heads", None, ANY): (64, 4),
    ("norm_chunk_sums", 64, ANY): (4, 3),
    ("norm_chunk_sums", None, ANY): (8, 3),
    ("norm_scan", None, ANY): (16,),
    # decoding: every p takes about 165 registers a thread at d=64 with decode_kernel.block_rows' blocks, so 3 programs
    # of 4 warps fit an SM: one wave, every program's loads in flight together
    ("decode_step", None, ANY): (4, 3),
}

_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp32": "fp32", "bf16": "bf16",
                "fp16": "fp16", "float64": "fp64", "fp64": "fp64"}


def dtype_name(dtype) -> str:
    """'bf16' / 'fp16' / 'fp32' / 'fp64' of a torch or triton dtype (or of such a name; '*' stays)."""
    if dtype is None or dtype == ANY:
        return ANY
    text = str(dtype).rsplit(".", 1)[-1]
    if text not in _DTYPE_NAMES:
        raise ValueError(f"dtype={dtype!r}: expected bf16, fp16, fp32 or fp64")
    return _DTYPE_NAMES[text]


@functools.lru_cache(maxsize=None)     # a launch asks at every call: short calls are host-bound, the table constant
def key(kernel: str, d: int, dtype=ANY) -> Optional[tuple]:
    """The TABLE key a call of `kernel` at head dim d with `dtype` operands reads, or None where no row serves it."""
    if kernel not in KERNELS:
        raise KeyError(f"kernel={kernel!r}: no such kernel in the tunables table; kernels: {sorted(KERNELS)}")
    name = dtype_name(dtype)
    rows = [(rd, rt) for (k, rd, rt) in TABLE if k == kernel and rt in (name, ANY) and (rd is None or rd >= d)]
    if not rows:
        return None
    bound = min(rd if rd is not None else float("inf") for rd, _ in rows)
    at = [(rd, rt) for rd, rt in rows if (rd if rd is not None else float("inf")) == bound]
    rd, rt = min(at, key=lambda row: row[1] == ANY)     # the call's own dtype before "*"
    return (kernel, rd, rt)


def find(kernel: str, d: int, dtype=ANY) -> Optional[tuple]:
    """The entry a call reads (None: the kernel has no such tile for this d and dtype)."""
    k = key(kernel, d, dtype)
    return None if k is None else TABLE[k]


def tile(kernel: str, d: int, dtype=ANY) -> tuple:
    """The entry a call reads; LookupError where there is none."""
    entry = find(kernel, d, dtype)
    if entry is None:
        raise LookupError(f"no {kernel} tile for d={d}, dtype={dtype_name(dtype)} in the tunables table")
    return entry


def describe(k: tuple) -> str:
    """A table key as one word: kernel[d<=64,bf16], kernel[d>64,*]."""
    kernel, d, dtype = k
    if d is None:
        below = [rd for (name, rd, _) in TABLE if name == kernel and rd is not None]
        return f"{kernel}[{'d>' + str(max(below)) if below else 'any d'},{dtype}]"
    return f"{kernel}[d<={d},{dtype}]"


def named(kernel: str, entry: Optional[tuple]) -> str:
    """An entry (or the tile a launch of `kernel` takes) with the names of its places: `BM=64 BN=32 warps=4 stages=3
    maxnreg=96`; None as "None"; one longer than its names, as the tuple."""
    names = FIELDS.get(kernel, ())
    if entry is None or len(entry) > len(names):
        return str(entry)
    return " ".join(f"{name}={value}" for name, value in zip(names, entry))
