"""@triton.jit helpers shared by several forms: head and block indexing of a program, the row factor
s^p e^(g_i), the gated key rows, the transposed scaled copies, and the combine of intra-chunk and state terms
(_combine_store). Also launch_options, the one reading of a block-table entry. Imports nothing of this package."""
from __future__ import annotations

import triton
import triton.language as tl


LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x, FTZ: tl.constexpr):
    """e^x. FTZ: one ex2.approx.ftz per element (results below 2^-126 flush to 0: weights that small add nothing)
    instead of tl.exp's denormal-safe sequence (a compare and two multiplies more); inline PTX, so never under the
    interpreter (launch_config's FTZ)."""
    if FTZ:
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * LOG2E], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _query_heads(pid_bh, HQ: tl.constexpr, HK: tl.constexpr):
    """Batch, query head and its kv head (GQA) of a program over b*hq."""
    i_b = (pid_bh // HQ).to(tl.int64)
    i_hq = pid_bh % HQ
    return i_b, i_hq, i_hq // (HQ // HK)


@triton.jit
def _kv_heads(pid_bh, HK: tl.constexpr):
    """Batch (int64: offsets built from it stay 64-bit) and kv head of a program over b*hk."""
    return (pid_bh // HK).to(tl.int64), pid_bh % HK


@triton.jit
def _has_state(n, HAS_S0: tl.constexpr):
    """1 if chunk n's queries see a state, else 0: without an incoming state S_0 = 0, so chunk 0 has no state term
    (the query kernels multiply their state-block counts by it)."""
    on = 1
    if not HAS_S0:
        on = tl.minimum(n, 1)
    return on


@triton.jit
def _query_block(T, HQ: tl.constexpr, HK: tl.constexpr, C: tl.constexpr, BM: tl.constexpr):
    """Program (query block of a chunk, chunk n, b*hq) of a chunked-form query kernel: batch, query head, its kv
    head, n, the block's token indices and their mask (inside the chunk and the sequence)."""
    pid_m = tl.program_id(0)
    n = tl.program_id(1)
    i_b, i_hq, i_hk = _query_heads(tl.program_id(2), HQ, HK)
    loc = pid_m * BM + tl.arange(0, BM)
    rows = n * C + loc
    return i_b, i_hq, i_hk, n, rows, (loc < C) & (rows < T)


@triton.jit
def _row_factor(G, scale_p, i_b, T, rows, mask, i_hk, HK: tl.constexpr, BM: tl.constexpr, GATED: tl.constexpr):
    """r = s^p e^(G_i) of query rows `rows` (0 where masked): the factor the state term of a query row carries."""
    r = tl.full([BM], 1.0, tl.float32) * scale_p
    if GATED:
        r = r * tl.exp(tl.load(G + (i_b * T + rows) * HK + i_hk, mask=mask, other=0.0))
    return tl.where(mask, r, 0.0)


@triton.jit
def _key_block(T, HK: tl.constexpr, C: tl.constexpr, BK: tl.constexpr):
    """Program (key block of a chunk, chunk n, b*hk) of a chunked-form key kernel: batch, kv head, n, b*hk, the
    block's token indices and their mask."""
    pid_k = tl.program_id(0)
    n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    i_b, i_hk = _kv_heads(pid_bh, HK)
    loc = pid_k * BK + tl.arange(0, BK)
    rows = n * C + loc
    return i_b, i_hk, n, pid_bh, rows, (loc < C) & (rows < T)


@triton.jit
def _key_decay(G, T, i_b, i_hk, n, row, mask, HK: tl.constexpr, C: tl.constexpr, GATED: tl.constexpr):
    """c_j = e^(gt_n - g_j) of a chunked-form key block's rows (flat (b, t, hk) index `row`): the decay from key j
    to the chunk's end (0 where masked)."""
    c = tl.where(mask, 1.0, 0.0)
    if GATED:
        g_end = tl.load(G + (i_b * T + n * C + C - 1) * HK + i_hk)
        c = c * tl.exp(g_end - tl.load(G + row, mask=mask, other=0.0))
    return c


@triton.jit
def _key_rows(V, G, T, i_b, i_hk, n, rows, mask, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
              GATED: tl.constexpr):
    """A chunked-form key block's rows: their (b, t, hk) row index, the offsets of their d values, v [BK, D] and
    their decay c (_key_decay)."""
    row = (i_b * T + rows) * HK + i_hk
    kv_off = row[:, None] * D + tl.arange(0, D)[None, :]
    v = tl.load(V + kv_off, mask=mask[:, None], other=0.0)
    return row, kv_off, v, _key_decay(G, T, i_b, i_hk, n, row, mask, HK, C, GATED)


@triton.jit
def _store_transposed(x, f, XT_ROWS, T, rows, mask, D: tl.constexpr):
    """Stores (x [BT, D] times the row factors f [BT]).T at XT_ROWS + c * T + rows (c < D): rows of a (b, h, D, T)
    copy, the layout the outer products read their factors from (chunk_p2.kernels._transpose_heads, and the chunked
    form's attention kernels with XT_MODE, which hold these rows anyway, scaled by their row factors)."""
    x = (x.to(tl.float32) * f[:, None]).to(XT_ROWS.dtype.element_ty)
    tl.store(XT_ROWS + tl.arange(0, D).to(tl.int64)[:, None] * T + rows[None, :], tl.trans(x), mask=mask[None, :])


@triton.jit
def _store_norm_weights(W_ROWS, dl, mask):
    """The query side's normalizer weights of rows W_ROWS (pointers to their 8 bf16 values): [hi, lo, 0, ...] with
    hi + lo = dl to ~2^-16 (read by chunk_p2.kernels.launch_norm_scan)."""
    hi = dl.to(tl.bfloat16)
    lo = (dl - hi.to(tl.float32)).to(tl.bfloat16)
    cols = tl.arange(0, 8)[None, :]
    w = tl.where(cols == 0, hi[:, None], tl.where(cols == 1, lo[:, None], 0.0))
    tl.store(W_ROWS[:, None] + cols, w.to(W_ROWS.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _combine_store(num, den, r, OI, LSEI, Y, LSE, row, mask, NORM: tl.constexpr, D: tl.constexpr):
    """Epilogue of the chunked form's query kernels: the state term (num [BM, D], den [BM], not yet scaled by
    the row factor r = s^p e^(g_i)) joins the intra-chunk output y_intra (normalized, lse_intra = log of its
    normalizer) of rows `row`: y = (y_intra e^lse + r num) / (e^lse + r den), stabilized by the larger of the
    two logs (norm), or y_intra + r num; stores y and lse = log(total normalizer)."""
    num = num * r[:, None]
    o_off = row[:, None] * D + tl.arange(0, D)[None, :]
    yi = tl.load(OI + o_off, mask=mask[:, None], other=0.0)
    if NORM:
        den = den * r
        lse_i = tl.load(LSEI + row, mask=mask, other=0.0)
        big = tl.maximum(lse_i, tl.log(tl.maximum(den, 1e-30)))
        a = tl.exp(lse_i - big)
        bb = tl.exp(-big)
        tot = a + den * bb                                               # >= 1 (stabilized)
        y = (yi * a[:, None] + num * bb[:, None]) / tot[:, None]
        tl.store(LSE + row, big + tl.log(tot), mask=mask)
    else:
        y = yi + num
    tl.store(Y + o_off, y.to(Y.dtype.element_ty), mask=mask[:, None])


def launch_options(entry) -> dict:
    """num_warps, num_stages and, where the entry has a 5th value, maxnreg of a block entry (tile, tile, warps,
    stages[, maxnreg]; the attention form's and chunk_p2's tables). The register cap lets more programs share an SM
    where registers, not shared memory, limit them."""
    opts = dict(num_warps=entry[2], num_stages=entry[3])
    if len(entry) > 4 and entry[4]:
        opts["maxnreg"] = entry[4]
    return opts
