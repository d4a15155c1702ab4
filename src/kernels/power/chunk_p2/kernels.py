"""Fast state kernels of the chunked form for p = 2 (tile 8): "grouped outer-product expansion".

Why a second set: the generic expand-MMA kernels (chunk.py) build each [rows, 64] block of phi by
pointer gathers and run [64 x 32 x 32] matmuls with one-hot "contract" matmuls in the backward; on an H200 they
reach ~9 TFLOP/s (docs/kernels.md). Here, for p = 2, a program handles a *group* of JG state blocks that share
their first tile: blocks (i, j0), (i, j0+1), ... (lexicographic, so their rows are consecutive in the layout).
Their features are the outer product of two plain row loads,

    phi_g(x) = reshape(x[:, 8i:8i+8, None] * x[:, None, 8j0:8j0+8JG], [rows, 64 JG]),
    feature f = a (8 JG) + 8 jj + b  <->  layout row 64 (l(i, j0) + jj) + 8 a + b,

so the expansion is one multiply per feature, the matmuls have 64 JG features on one side, and the gradient
of phi back to x needs no matmul: with X = dL/dphi_g reshaped [rows, 8, 8 JG],
dx[8i + a] += sum_c X[a, c] x[8j0 + c] and dx[8j0 + c] += sum_a X[a, c] x[8i + a], read-modify-written into
the fp32 gradient buffer (rows are private to the program; a barrier orders the overlapping updates).
Gate gradients use Euler's identity for the degree-2 form: X . phi = sum_a x[8i + a] dx_i[a].

The query forward needs no phi at all: _sym2_query_fwd_rows scales the rows of plain matmuls with slices of S
instead (section "row-scaled" below). The key
backward's dv and (for d <= 64) the query backward are row-scaled the same way (_sym2_key_dv_rows,
_sym2_query_bwd_rows); the key dk stays grouped (its row-scaled Triton version measured slower). Where Gluon runs
(gluon_rows.py), the query backward and key dk go over the state's symmetric completion instead.

Same buffers, slots and semantics as the generic kernels (chunk.py's docstring); bf16 inputs keep the
per-chunk states in bf16 (chunk.ChunkedForm), matmul operands are DOT_DT (bf16 for bf16 inputs) with fp32
accumulation.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from . import config
from .config import GLUON_OUTER_DIMS, TILE2
from .. import tunables
from .._common import (_combine_store, _has_state, _key_block, _key_decay, _key_rows, _kv_heads, _query_block,
                       _row_factor, _store_transposed, launch_options as _entry_options)



@triton.jit
def _pair(X_row, ti, tj, mask, colj, jvalid, TW: tl.constexpr):
    """Rows' first factor x[:, 8ti:8ti+8] [B, 8] and second factor x[:, 8tj:8tj+8JG] [B, 8JG] (fp32)."""
    xi = tl.load(X_row[:, None] + ti * TW + tl.arange(0, TW)[None, :], mask=mask[:, None], other=0.0)
    xj = tl.load(X_row[:, None] + colj[None, :], mask=mask[:, None] & jvalid[None, :], other=0.0)
    return xi.to(tl.float32), xj.to(tl.float32)


@triton.jit
def _multiplicity(j, ti, TW: tl.constexpr):
    """The key side's weight of the features (i, j) with i in tile ti: 1 inside tile ti (the diagonal block holds
    both orders), 2 after it (an off-diagonal block holds one); j and ti of any broadcastable shapes."""
    return tl.where(j // TW == ti, 1.0, 2.0)


@triton.jit
def _feature_rows(l0, a, c, TW: tl.constexpr):
    """Layout rows of the features (a, c) of a group starting at block l0: first index a < 8 of its first tile,
    second index c over its JG second tiles."""
    return (l0 + c // TW) * (TW * TW) + a * TW + c % TW


@triton.jit
def _group(GRP, g, TW: tl.constexpr, JG: tl.constexpr, D: tl.constexpr):
    """Group g's first tile, first second-tile, the layout rows of its 64 JG features and their validity."""
    ti = tl.load(GRP + 3 * g)
    tj = tl.load(GRP + 3 * g + 1)
    l0 = tl.load(GRP + 3 * g + 2)
    offs = tl.arange(0, TW * TW * JG)
    a = offs // (TW * JG)
    c = offs % (TW * JG)
    lrow = _feature_rows(l0, a, c, TW)
    fvalid = tj * TW + c < D
    colj = tj * TW + tl.arange(0, TW * JG)
    return ti, tj, lrow, fvalid, colj, colj < D


@triton.jit
def _rmw(P, val, mask, ATOMIC: tl.constexpr):
    """P += val on rows private to this program: after a barrier (another thread may have written them), or as
    relaxed atomic adds (ATOMIC: no barrier, the warps need not wait for each other between groups)."""
    if ATOMIC:
        tl.atomic_add(P, val, mask=mask, sem="relaxed")
    else:
        tl.debug_barrier()
        tl.store(P, tl.load(P, mask=mask, other=0.0) + val, mask=mask)


@triton.jit
def _cast_rows(DX, DXO, row, mask, H: tl.constexpr, D: tl.constexpr, CAST: tl.constexpr):
    """CAST: DXO = the fp32 gradient rows DX in DXO's dtype, by the program whose updates to them were the last (the
    host's conversion pass folded in). `row`: the flat (b, t, H) index of the block's rows, consecutive tokens, valid
    where `mask` (a prefix). After a barrier, read past L1: the other warps' atomics are done at L2. In pieces of 16
    rows with their addresses formed here: a [rows, D] address tensor live across the kernel cost ~40 registers."""
    if CAST:
        tl.debug_barrier()
        row0 = tl.min(row, axis=0)
        nvalid = tl.sum(mask.to(tl.int32), axis=0)
        offs_d = tl.arange(0, D)
        for r0 in range(0, row.shape[0], 16):
            r = r0 + tl.arange(0, 16)
            off = (row0 + r * H).to(tl.int64)[:, None] * D + offs_d[None, :]
            m = (r < nvalid)[:, None]
            x = tl.load(DX + off, mask=m, other=0.0, cache_modifier=".cg")
            tl.store(DXO + off, x.to(DXO.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------
# sum over a chunk's rows of (row factor * phi(x)) (x) y: update-state (keys) and the query-side state gradient
# ----------------------------------------------------------------------------------------------
@triton.jit
def _transpose_heads(X, XT, T, H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
    """XT (b, h, D, T) = X (b, T, h, D) transposed, program (time block, b*h): the column-major copy of q or k that
    _sym2_outer reads its factors from. (The Gluon outer products read copies scaled by their row factors, written by
    the intra-chunk attention kernels: parallel._attn_fwd / _attn_bwd_dq with XT_MODE.)"""
    pid_bh = tl.program_id(1)
    i_b = pid_bh // H
    i_h = pid_bh % H
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    offs_d = tl.arange(0, D)
    mask = rows < T
    x = tl.load(X + ((i_b * T + rows) * H + i_h).to(tl.int64)[:, None] * D + offs_d[None, :], mask=mask[:, None])
    _store_transposed(x, tl.full([BT], 1.0, tl.float32), XT + pid_bh.to(tl.int64) * D * T, T, rows, mask, D)


@triton.jit
def _sym2_outer(X, Y, G, LSE, DELTA, GRP, OUT, OUTZ, scale_p, T, NC, DS, SLOT,
                HX: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr, TW: tl.constexpr,
                JG: tl.constexpr, BK: tl.constexpr, KEYS: tl.constexpr, NORM: tl.constexpr,
                GATED: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """Program (group g, chunk n, b*hk) writes slot n + SLOT of OUT (b, hk, NC+1, DS, D) / OUTZ for its group:
    KEYS: U_n = sum_j (w phi(k_j) e^(gt_n - g_j)) v_j^T, Uz_n = sum_j w phi(k_j) e^(gt_n - g_j)  (X=k, Y=v);
    else: Q_n = sum_i r_i phi(q_i)^T dn_i, Qz_n = sum_i r_i phi(q_i) dl_i over the GQA group's query heads
    (X=q, Y=dy; r_i = s^p e^(g_i) / Den_i, dl_i = -Delta_i / Den_i folded as r_i * (-Delta_i)).
    X is the transposed copy (b, HX, D, T) (_transpose_heads), so the factors load as [8, BK] and [8 JG, BK] rows of
    128 contiguous bytes: read from the (b, T, HX, D) layout they were 16-byte rows whose shared-memory copy the
    expansion read with 8-way bank conflicts (ncu)."""
    g = tl.program_id(0)
    n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    i_b, i_hk = _kv_heads(pid_bh, HK)
    REP: tl.constexpr = HX // HK
    FG: tl.constexpr = TW * TW * JG
    ti, tj, lrow, fvalid, colj, jvalid = _group(GRP, g, TW, JG, D)
    offs_r = tl.arange(0, BK)
    offs_d = tl.arange(0, D)
    start = n * C
    if KEYS:
        wj = _multiplicity(colj, ti, TW)
        if GATED:
            g_end = tl.load(G + (i_b * T + start + C - 1) * HK + i_hk)
    acc = tl.zeros([FG, D], tl.float32)
    # the normalizer sums accumulate elementwise in phi^T's own layout and reduce once after the loop: a row
    # sum per step cost ~80 lane shuffles and a second copy of phi^T in another layout (sm_90 PTX)
    accz_t = tl.zeros([FG, BK], tl.float32)
    for rep in range(REP):
        i_h = i_hk * REP + rep
        for r0 in range(0, C, BK):
            rows = start + r0 + offs_r
            mask = ((r0 + offs_r) < C) & (rows < T)
            row = (i_b * T + rows) * HX + i_h
            xt = X + ((i_b * HX + i_h) * D).to(tl.int64) * T + rows[None, :]
            xi_t = tl.load(xt + (ti * TW + tl.arange(0, TW))[:, None] * T, mask=mask[None, :], other=0.0)
            xj_t = tl.load(xt + colj[:, None] * T, mask=jvalid[:, None] & mask[None, :], other=0.0)
            xi_t = xi_t.to(tl.float32)
            xj_t = xj_t.to(tl.float32)
            if KEYS:
                f = tl.where(mask, 1.0, 0.0)
                if GATED:
                    f = f * tl.exp(g_end - tl.load(G + (i_b * T + rows) * HK + i_hk, mask=mask, other=0.0))
                xj_t = xj_t * wj[:, None]
            else:
                f = _row_factor(G, scale_p, i_b, T, rows, mask, i_hk, HK, BK, GATED)
                if NORM:
                    f = f * tl.exp(-tl.load(LSE + row, mask=mask, other=0.0))
            yv = tl.load(Y + row[:, None] * D + offs_d[None, :], mask=mask[:, None], other=0.0)
            # phi^T built as [FG, BK] from the transposed factors: the matmul's first operand as it stands
            # (building phi [BK, FG] and transposing it was 5% slower on the H200, docs/kernels.md)
            phi_t = tl.reshape((xi_t * f[None, :])[:, None, :] * xj_t[None, :, :], (FG, BK))
            acc += tl.dot(phi_t.to(DOT_DT), yv.to(DOT_DT), input_precision=PREC)
            if KEYS:
                accz_t += phi_t
            elif NORM:
                dl = -tl.load(DELTA + row, mask=mask, other=0.0)
                accz_t += phi_t * dl[None, :]
    accz = tl.sum(accz_t, axis=1)
    base = (pid_bh.to(tl.int64) * (NC + 1) + n + SLOT) * DS
    tl.store(OUT + (base + lrow)[:, None] * D + offs_d[None, :], acc, mask=fvalid[:, None])
    tl.store(OUTZ + base + lrow, accz, mask=fvalid)


# ----------------------------------------------------------------------------------------------
# query side: forward (fused with the combine) and backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _query_rows(scale_p, G, T, NC, DS, HQ: tl.constexpr, HK: tl.constexpr, C: tl.constexpr, BM: tl.constexpr,
                GATED: tl.constexpr):
    """Prologue of the query kernels, program (query block of a chunk, chunk n, b*hq): the flat (b, t, hq) index
    of its rows, their mask, the row factor r = s^p e^(g_i), the chunk index and its state slot's base."""
    i_b, i_hq, i_hk, n, rows, mask = _query_block(T, HQ, HK, C, BM)
    r = _row_factor(G, scale_p, i_b, T, rows, mask, i_hk, HK, BM, GATED)
    s_base = ((i_b * HK + i_hk) * (NC + 1) + n) * DS
    return (i_b * T + rows) * HQ + i_hq, mask, r, n, s_base


@triton.jit
def _query_grad_rows(DO, LSE, DELTA, row, mask, BM: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr):
    """The query backward's row inputs: dn = dy / Den and (NORM) dl = -Delta / Den (fp32)."""
    dn = tl.load(DO + row[:, None] * D + tl.arange(0, D)[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    dl = tl.zeros([BM], tl.float32)
    if NORM:
        inv = tl.exp(-tl.load(LSE + row, mask=mask, other=0.0))
        dn = dn * inv[:, None]
        dl = -tl.load(DELTA + row, mask=mask, other=0.0) * inv
    return dn, dl


@triton.jit
def _sym2_query_bwd(Q, G, GRP, S, Z, DO, LSE, DELTA, DQ, DQO, DGQ, scale_p, T, NC, DS, NG,
                    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr, TW: tl.constexpr,
                    JG: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                    HAS_S0: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, ATOMIC: tl.constexpr,
                    CAST: tl.constexpr = False):
    """Query side of the state term: X = r (S_n dn + z_n dl) = dL/dphi(q); DQ (fp32) += dphi/dq^T X;
    DGQ = X . phi(q) (Euler: sum_a q[8i+a] dq_i[a] per group); CAST: DQO = DQ in the inputs' dtype."""
    row, mask, r, n, s_base = _query_rows(scale_p, G, T, NC, DS, HQ, HK, C, BM, GATED)
    offs_d = tl.arange(0, D)
    dn, dl = _query_grad_rows(DO, LSE, DELTA, row, mask, BM, D, NORM)
    dg = tl.zeros([BM], tl.float32)
    dq_row = DQ + row * D
    for g in range(NG * _has_state(n, HAS_S0)):
        ti, tj, lrow, fvalid, colj, jvalid = _group(GRP, g, TW, JG, D)
        xi, xj = _pair(Q + row * D, ti, tj, mask, colj, jvalid, TW)
        s_blk = tl.load(S + (s_base + lrow)[:, None] * D + offs_d[None, :], mask=fvalid[:, None], other=0.0)
        x = tl.dot(dn.to(DOT_DT), tl.trans(s_blk.to(DOT_DT)), input_precision=PREC)      # [BM, FG]
        if NORM:
            z_blk = tl.load(Z + s_base + lrow, mask=fvalid, other=0.0)
            x += dl[:, None] * z_blk[None, :]
        x3 = tl.reshape(x, (BM, TW, TW * JG))
        dxi = tl.sum(x3 * xj[:, None, :], axis=2) * r[:, None]                              # [BM, 8]
        dxj = tl.sum(x3 * xi[:, :, None], axis=1) * r[:, None]                              # [BM, 8JG]
        dg += tl.sum(xi * dxi, axis=1)
        _rmw(dq_row[:, None] + ti * TW + tl.arange(0, TW)[None, :], dxi, mask[:, None], ATOMIC)
        _rmw(dq_row[:, None] + colj[None, :], dxj, mask[:, None] & jvalid[None, :], ATOMIC)
    if GATED:
        tl.store(DGQ + row, dg, mask=mask)
    _cast_rows(DQ, DQO, row, mask, HQ, D, CAST)


# ----------------------------------------------------------------------------------------------
# query side, row-scaled: no phi operand at all
# ----------------------------------------------------------------------------------------------
# For a first index i = 8 ti + a, the layout rows of the features (i, j), j >= 8 ti (the tiles j of blocks
# (ti, tj >= ti)), form a [d - 8 ti, d] slice S_i of the state, and
#     phi(q) S = sum_i q_i (q_win S_i),     q_win = q[:, 8 ti:],
# so each i is a plain matmul of the loaded query rows with a gathered slice of S, scaled by the column q_i
# afterwards (one FMA per output element; the grouped kernels instead build phi as a matmul operand, which
# costs a multiply, a conversion and a shared-memory round trip per element). Slices are padded to the
# window [J0, J0 + KW) with zero rows: KW = d for ti < T1 and KW = d/2 (J0 = d/2) after, 1.35-1.5x the
# matmul work of the exact layout. The normalizer term is one small matmul: phi(q) . z = sum_i q_i (q Zm)_i
# with Zm[j, i] = z of feature (i, j) (0 if j's tile is before i's).
@triton.jit
def _diag_block(ti, NT: tl.constexpr):
    """Block index l(ti, ti) of the lexicographic layout of blocks (i, j >= i)."""
    return ti * NT - (ti * (ti - 1)) // 2


@triton.jit
def _win(ti, a, j, NT: tl.constexpr, TW: tl.constexpr):
    """Layout rows of the features (TW ti + a, j) and whether they exist (tile(j) >= ti); j may be any shape."""
    tj = j // TW
    return (_diag_block(ti, NT) + tj - ti) * (TW * TW) + a * TW + j % TW, tj >= ti


@triton.jit
def _zmat(Z, s_base, D: tl.constexpr, NT: tl.constexpr, TW: tl.constexpr):
    """Zm [D (j), D (i)]: the normalizer state of feature (i, j), 0 where that feature is not in the layout."""
    i = tl.arange(0, D)[None, :]
    lrow, valid = _win(i // TW, i % TW, tl.arange(0, D)[:, None], NT, TW)
    return tl.load(Z + s_base + lrow, mask=valid, other=0.0)


@triton.jit
def _norm_chunk_sums(X, W, ZC, T, NC, HX: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
                     BK: tl.constexpr, WEIGHTED: tl.constexpr, CPP: tl.constexpr):
    """Program (chunks CPP m .. CPP m + CPP - 1, b*hk): ZC[b*hk, n] = sum over chunk n's rows r of its GQA heads of
    w_r x'_r x'_r^T, [D, D] fp32: the normalizer sums of the p=2 features in matrix form (feature (i, j) is entry
    [i, j]). X: the (b, HX, D, T) scaled copy the outer products read (rows already times the square roots of their
    row factors); WEIGHTED (the query side): w_r = hi + lo of W (b, T, HX, 8), the rows' -Delta, and x' w is split
    into bf16 hi + lo before its matmul; keys: w = 1. The products are exact in the matmul (bf16 x bf16 in fp32), so
    no lo of the features is needed, unlike sums of the bf16 features phi. The CPP chunks are one loop (a chunk's
    sum stored, and the accumulator cleared, at its last step) so that the loads stay pipelined across chunks: at
    chunk 512, one program a chunk took twice chunk 1024's time for the same bytes."""
    m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    i_b = pid_bh // HK
    i_hk = pid_bh % HK
    REP: tl.constexpr = HX // HK
    STEPS: tl.constexpr = REP * (C // BK)          # steps a chunk: its row blocks, for each GQA head
    offs_d = tl.arange(0, D)
    offs_r = tl.arange(0, BK)
    acc = tl.zeros([D, D], tl.float32)
    out = ZC + ((pid_bh.to(tl.int64) * NC + m * CPP) * D + offs_d[:, None]) * D + offs_d[None, :]
    if WEIGHTED:     # the weights one step ahead: strided 2-byte loads, not pipelined by the compiler as x is
        w_next = _norm_sums_weights(W, 0, m, i_b, i_hk, offs_r, T, HX, REP, C, BK, CPP)
    for s in range(CPP * STEPS):
        c = s // STEPS
        h = i_hk * REP + (s % STEPS) // (C // BK)
        t0 = (m * CPP + c) * C + (s % (C // BK)) * BK
        x = tl.load(X + ((i_b * HX + h) * D).to(tl.int64) * T + t0 + offs_d[:, None] * T + offs_r[None, :])  # [D, BK]
        if WEIGHTED:
            w = w_next
            w_next = _norm_sums_weights(W, (s + 1) % (CPP * STEPS), m, i_b, i_hk, offs_r, T, HX, REP, C, BK, CPP)
            xw = x.to(tl.float32) * w[None, :]
            hi = xw.to(x.dtype)
            acc = tl.dot(hi, tl.trans(x), acc)
            acc = tl.dot((xw - hi.to(tl.float32)).to(x.dtype), tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(x), acc)
        if s % STEPS == STEPS - 1:
            tl.store(out + c * (D * D), acc)
            acc = tl.zeros([D, D], tl.float32)


@triton.jit
def _norm_sums_weights(W, s, m, i_b, i_hk, offs_r, T, HX: tl.constexpr, REP: tl.constexpr, C: tl.constexpr,
                       BK: tl.constexpr, CPP: tl.constexpr):
    """The query side's row weights w = hi + lo of W (b, T, HX, 8) for _norm_chunk_sums' step s, fp32 [BK]."""
    STEPS: tl.constexpr = REP * (C // BK)
    h = i_hk * REP + (s % STEPS) // (C // BK)
    t0 = (m * CPP + s // STEPS) * C + (s % (C // BK)) * BK
    wrow = W + ((i_b * T + t0 + offs_r).to(tl.int64) * HX + h) * 8
    return tl.load(wrow).to(tl.float32) + tl.load(wrow + 1).to(tl.float32)


@triton.jit
def _norm_scan(ZC, G, OUTZ, ZF, DGT, T, NC, DS, SLOT, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
               NT: tl.constexpr, TW: tl.constexpr, BI: tl.constexpr, KEYS: tl.constexpr, GATED: tl.constexpr,
               DU_MULT: tl.constexpr, SUMS: tl.constexpr, AHEAD: tl.constexpr = 0):
    """Program (b*hk, rows block): the gated cumulative sum over chunks of the packed normalizer state OUTZ (b, hk,
    NC+1, DS), for the features (i, j) with i in rows [BI r, BI r + BI) (the layout holds (i, j) for tile(j) >=
    tile(i): _win), from the chunks' sums ZC (_norm_chunk_sums; SUMS False: none, the state only decays). What
    gluon_outer's SCAN does for the normalizer: keys (forward): z_{n+1} = decay_n z_n + sums_n into slot n + SLOT
    (slot 0 holds z_0), with the key side's multiplicities (1 in the diagonal tile, 2 after it) as stored; query
    side (reverse): slot NC holds dL/dz_NC, R_n = sums_n + decay_n R_{n+1} into slot n + SLOT, and with GATED
    DGT[b*hk, r, n] = decay_n <z_n, R_{n+1}> over these features (ZF: the forward's states); DU_MULT: slots but 0
    (and the entering slot NC) times the key side's multiplicities."""
    pid_bh = tl.program_id(0)
    pr = tl.program_id(1)
    i_b = pid_bh // HK
    i_hk = pid_bh % HK
    i = pr * BI + tl.arange(0, BI)[:, None]
    j = tl.arange(0, D)[None, :]
    P, held = _win(i // TW, i % TW, j, NT, TW)
    mult_k = tl.where(i // TW == j // TW, 1.0, 2.0)
    slot0 = pid_bh.to(tl.int64) * (NC + 1)
    first = NC if not KEYS else 0
    z = tl.load(OUTZ + (slot0 + first) * DS + P, mask=held, other=0.0)
    if KEYS:
        z = z / mult_k
    if DU_MULT:        # slot NC (dL/dz_NC, written by the host) is dUz_{NC-1}: with the key side's multiplicities
        tl.store(OUTZ + (slot0 + first) * DS + P, z * mult_k, mask=held)
    zc_base = ZC + pid_bh.to(tl.int64) * NC * D * D + i * D + j
    # AHEAD: the next chunk's loads are issued before this chunk's sums and stores (one after another, each step
    # waited on its loads: at chunk 512 the 128 steps took ~2.8 us each); (ci + 1) % NC stays in bounds at the end
    if AHEAD:
        ahead = _norm_scan_inputs(G, ZF, zc_base, slot0, P, held, 0, i_b, i_hk, T, NC, DS, HK, D, C, KEYS, GATED,
                                  SUMS)
    for ci in range(NC):
        n = ci if KEYS else NC - 1 - ci
        if AHEAD:
            decay, zf, zc = ahead
            ahead = _norm_scan_inputs(G, ZF, zc_base, slot0, P, held, (ci + 1) % NC, i_b, i_hk, T, NC, DS, HK, D,
                                      C, KEYS, GATED, SUMS)
        else:
            decay, zf, zc = _norm_scan_inputs(G, ZF, zc_base, slot0, P, held, ci, i_b, i_hk, T, NC, DS, HK, D, C,
                                              KEYS, GATED, SUMS)
        if GATED:
            if not KEYS:     # dgt_n = decay_n <z_n, R_{n+1}> (z_n with the multiplicities, R plain)
                tl.store(DGT + (pid_bh.to(tl.int64) * tl.num_programs(1) + pr) * NC + n, decay * tl.sum(zf * z))
            z = z * decay
        if SUMS:
            z += zc
        out = z
        if KEYS:
            out = z * mult_k
        if DU_MULT:
            out = tl.where(n == 0, z, z * mult_k)
        tl.store(OUTZ + (slot0 + n + SLOT) * DS + P, out, mask=held)


@triton.jit
def _norm_scan_inputs(G, ZF, zc_base, slot0, P, held, ci, i_b, i_hk, T, NC, DS, HK: tl.constexpr, D: tl.constexpr,
                      C: tl.constexpr, KEYS: tl.constexpr, GATED: tl.constexpr, SUMS: tl.constexpr):
    """What _norm_scan's step ci reads: chunk n's decay (1 ungated), the forward's z_n (the gated query side's dgt;
    else zeros) and the chunk's sums (zeros without SUMS); n = ci for keys, NC - 1 - ci for the query side."""
    n = ci if KEYS else NC - 1 - ci
    decay = tl.full([], 1.0, tl.float32)
    zf = tl.zeros(P.shape, tl.float32)
    zc = tl.zeros(P.shape, tl.float32)
    if GATED:
        decay = tl.exp(tl.load(G + (i_b * T + n * C + C - 1) * HK + i_hk))
        if not KEYS:
            zf = tl.load(ZF + (slot0 + n) * DS + P, mask=held, other=0.0)
    if SUMS:
        zc = tl.load(zc_base + n * (D * D), mask=held, other=0.0)
    return decay, zf, zc


@triton.jit
def _key_weights(qw, j, ti, TW: tl.constexpr):
    """The key side's operand for first tile ti: the window's columns j times their multiplicities (1 in tile ti, 2
    after it; exact in bf16)."""
    return qw * _multiplicity(j, ti, TW).to(qw.dtype)[None, :]


@triton.jit
def _slice(S, s_base, ti, a, j, NT: tl.constexpr, TW: tl.constexpr, D: tl.constexpr):
    """S_i [KW, D]: the state rows of the features (i, j), i = TW ti + a, over the window's columns j (0 for the
    features not in the layout)."""
    # row (l(ti, tj) * TW + a) * TW + j % TW split as a scalar per slice plus a per-column part that does not
    # depend on the slice (hoisted out of the slice loops), so each slice costs one scalar add to its addresses
    tj = j // TW
    first = ((_diag_block(ti, NT) - ti) * TW + a) * TW
    cols = (tj * (TW * TW) + j % TW)[:, None] * D + tl.arange(0, D)[None, :]
    return tl.load(S + (s_base + first) * D + cols, mask=(tj >= ti)[:, None], other=0.0)


@triton.jit
def _rows_slice(num, q_i_ptr, qw, S, s_base, ti, a, j, mask, NT: tl.constexpr, TW: tl.constexpr, D: tl.constexpr,
                DOT_DT: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """num += q_i (qw S_i) for the first index i = TW ti + a: slice S_i gathered over the window's columns j.
    ACC: as num += (q_i qw) S_i, the scaled window an operand built in registers (q_i q_j rounded to DOT_DT, as the
    grouped kernels' phi), so consecutive products accumulate in the tensor cores without waiting for each other;
    else the product is formed in fp32 and scaled after it (one wait per slice)."""
    s_i = _slice(S, s_base, ti, a, j, NT, TW, D)
    q_i = tl.load(q_i_ptr, mask=mask, other=0.0).to(tl.float32)
    if ACC:
        return tl.dot((qw.to(tl.float32) * q_i[:, None]).to(DOT_DT), s_i.to(DOT_DT), num, input_precision=PREC)
    return num + q_i[:, None] * tl.dot(qw, s_i.to(DOT_DT), input_precision=PREC)


@triton.jit
def _rows_fwd_pass(num, q_row, qw, S, s_base, mask, t_lo, t_hi, J0: tl.constexpr, KW: tl.constexpr,
                   NT: tl.constexpr, TW: tl.constexpr, D: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr,
                   KEYS: tl.constexpr, PIPE: tl.constexpr = 0, ACC: tl.constexpr = False):
    """num += sum over first tiles ti in [t_lo, t_hi) and a < TW of q_i (qw S_i), window [J0, J0 + KW).
    KEYS: qw (DOT_DT) takes the key side's multiplicities per ti (_key_weights).
    PIPE > 0: the slices S_i load with PIPE stages (cp.async) while the previous one multiplies (ncu: the
    unpipelined loops waited on their global loads 59% of the time); one flat loop over i = TW ti + a, or with KEYS,
    whose operand changes per tile, a pipelined loop within each tile."""
    j = J0 + tl.arange(0, KW)
    if PIPE > 0 and not KEYS:
        for i in tl.range(t_lo * TW, t_hi * TW, num_stages=PIPE):
            num = _rows_slice(num, q_row + i, qw, S, s_base, i // TW, i % TW, j, mask, NT, TW, D, DOT_DT, PREC,
                              ACC)
    elif PIPE > 0:
        for ti in range(t_lo, t_hi):
            qw_t = _key_weights(qw, j, ti, TW)
            for a in tl.range(TW, num_stages=PIPE):
                num = _rows_slice(num, q_row + ti * TW + a, qw_t, S, s_base, ti, a, j, mask, NT, TW, D, DOT_DT,
                                  PREC, ACC)
    else:
        for ti in range(t_lo, t_hi):
            if KEYS:
                qw_t = _key_weights(qw, j, ti, TW)
            else:
                qw_t = qw
            for a in range(TW):
                num = _rows_slice(num, q_row + ti * TW + a, qw_t, S, s_base, ti, a, j, mask, NT, TW, D, DOT_DT,
                                  PREC, ACC)
    return num


@triton.jit
def _sym2_query_fwd_rows(Q, G, S, Z, OI, LSEI, Y, LSE, scale_p, T, NC, DS,
                         HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr, TW: tl.constexpr,
                         KW2: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                         HAS_S0: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, PIPE: tl.constexpr = 0):
    """The query forward, row-scaled (see above): tiles ti < T1 use the full window, the rest [d - KW2, d)."""
    row, mask, r, n, s_base = _query_rows(scale_p, G, T, NC, DS, HQ, HK, C, BM, GATED)
    NT: tl.constexpr = D // TW
    T1: tl.constexpr = (D - KW2) // TW
    offs_d = tl.arange(0, D)
    q_row = Q + row * D
    qf = tl.load(q_row[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(q_row[:, None] + (D - KW2) + tl.arange(0, KW2)[None, :], mask=mask[:, None], other=0.0)
    den = tl.zeros([BM], tl.float32)
    if NORM:
        den = tl.sum(qf * tl.dot(qf, _zmat(Z, s_base, D, NT, TW), input_precision="tf32x3"), axis=1)
    on = _has_state(n, HAS_S0)
    num = tl.zeros([BM, D], tl.float32)
    num = _rows_fwd_pass(num, q_row, qf.to(DOT_DT), S, s_base, mask, 0, T1 * on, 0, D, NT, TW, D, DOT_DT, PREC,
                         False, PIPE)
    num = _rows_fwd_pass(num, q_row, q2.to(DOT_DT), S, s_base, mask, T1, T1 + (NT - T1) * on, D - KW2, KW2,
                         NT, TW, D, DOT_DT, PREC, False, PIPE)
    _combine_store(num, den, r, OI, LSEI, Y, LSE, row, mask, NORM, D)


@triton.jit
def _sym2_key_dv_rows(K, G, DU, DV, T, NC, DS, NU, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
                      TW: tl.constexpr, KW2: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr,
                      DOT_DT: tl.constexpr, PREC: tl.constexpr, PIPE: tl.constexpr = 0):
    """The key backward's dv, row-scaled like the query forward: dv_j += c_j sum_i k_i (k_win,w dU_i) with the
    key side's multiplicities w on the window's columns, c_j = e^(gt_n - g_j); program (key block of a chunk,
    chunk n, b*hk). DV holds the intra-chunk part already, in the inputs' dtype (bf16: the buffer is dv itself, no
    fp32 copy and no conversion pass); the sum is formed in fp32 and written back in place. The windows' products
    accumulate on the tensor cores (_rows_slice's ACC: 6.60 -> 6.23 ms at 128 rows)."""
    i_b, i_hk, n, pid_bh, rows, mask = _key_block(T, HK, C, BK)
    NT: tl.constexpr = D // TW
    T1: tl.constexpr = (D - KW2) // TW
    row = (i_b * T + rows) * HK + i_hk
    k_row = K + row * D
    offs_d = tl.arange(0, D)
    kf = tl.load(k_row[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0).to(DOT_DT)
    k2 = tl.load(k_row[:, None] + (D - KW2) + tl.arange(0, KW2)[None, :], mask=mask[:, None], other=0.0).to(DOT_DT)
    u_base = (pid_bh.to(tl.int64) * NU + n) * DS
    dv = tl.zeros([BK, D], tl.float32)
    dv = _rows_fwd_pass(dv, k_row, kf, DU, u_base, mask, 0, T1, 0, D, NT, TW, D, DOT_DT, PREC, True, PIPE, True)
    dv = _rows_fwd_pass(dv, k_row, k2, DU, u_base, mask, T1, NT, D - KW2, KW2, NT, TW, D, DOT_DT, PREC, True, PIPE,
                        True)
    c = _key_decay(G, T, i_b, i_hk, n, row, mask, HK, C, GATED)
    kv_off = row[:, None] * D + offs_d[None, :]
    dv = dv * c[:, None] + tl.load(DV + kv_off, mask=mask[:, None], other=0.0).to(tl.float32)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=mask[:, None])


# ----------------------------------------------------------------------------------------------
# row-scaled backward contractions: the query backward's dq and the key backward's dk
# ----------------------------------------------------------------------------------------------
# The gradient of phi(x) back to x, one first index i = 8 ti + a at a time: with the slice M_i of S (queries) or
# dU (keys) gathered over the window's columns j (as in the forward above), X_i = a M_i^T [rows, KW] is
# dL/dphi over the features (i, j) (a = dn or v). Then
#     dx[:, j] += x[:, i] * X_i[:, j]          (an FMA in the matmul's own layout), and
#     dx[:, i] += sum_j X_i[:, j] x[:, j]      (a row sum),
# with no phi operand and no shared-memory reshape of the product (the grouped kernels' top stalls, ncu).
# The first-index sums of a tile collect in a [rows, 8] tile written once per tile. The normalizer part of X
# (dl z, or dUz for keys) needs no per-i work: its gradient is dl x (Zm + Zm^T) with Zm as in _zmat.
@triton.jit
def _rows_grad_pass(acc, dg, a_op, xw, x_row, dx_row, M, m_base, mask, rf, t_lo, t_hi, J0: tl.constexpr,
                    KW: tl.constexpr, NT: tl.constexpr, TW: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                    DOT_DT: tl.constexpr, PREC: tl.constexpr, KEYS: tl.constexpr, ATOMIC: tl.constexpr,
                    PIPE: tl.constexpr):
    """Over first tiles ti in [t_lo, t_hi), window [J0, J0 + KW): acc [BM, KW] += X_i * x[:, i] (the second-index
    gradients), dx[:, i] += rf * sum_j X_i[:, j] x[:, j] (read-modify-written per tile), dg += x[:, i] * that sum.
    xw: x's window columns (fp32); KEYS: X_i carries the multiplicities (1 in tile ti, 2 after)."""
    j = J0 + tl.arange(0, KW)
    cols = tl.arange(0, TW)
    for ti in range(t_lo, t_hi):
        if KEYS:
            w = _multiplicity(j, ti, TW)
        dfirst = tl.zeros([BM, TW], tl.float32)
        for a in tl.range(TW, num_stages=PIPE):
            m_i = _slice(M, m_base, ti, a, j, NT, TW, D)
            x = tl.dot(a_op, tl.trans(m_i.to(DOT_DT)), input_precision=PREC)                 # [BM, KW]
            if KEYS:
                x = x * w[None, :]
            x_i = tl.load(x_row + ti * TW + a, mask=mask, other=0.0).to(tl.float32)
            acc += x * x_i[:, None]
            g_i = tl.sum(x * xw, axis=1)
            dfirst = tl.where(cols[None, :] == a, g_i[:, None], dfirst)
            dg += x_i * g_i
        _rmw(dx_row[:, None] + ti * TW + cols[None, :], dfirst * rf[:, None], mask[:, None], ATOMIC)
    return acc, dg


@triton.jit
def _rows_grad(a_op, x_row, dx_row, M, MZ, m_base, zl, rf, mask, KW2: tl.constexpr, D: tl.constexpr,
               TW: tl.constexpr, BM: tl.constexpr, on, DOT_DT: tl.constexpr, PREC: tl.constexpr, KEYS: tl.constexpr,
               ATOMIC: tl.constexpr, PIPE: tl.constexpr, NORM: tl.constexpr):
    """dx += rf * dphi/dx^T X for X = a M^T + zl MZ (features of the layout; zl a row factor, 1 for keys; the MZ
    term only with NORM), over all first tiles (none when on = 0); returns X . phi (Euler: the gate gradient,
    before rf)."""
    NT: tl.constexpr = D // TW
    T1: tl.constexpr = (D - KW2) // TW
    offs_d = tl.arange(0, D)
    xf = tl.load(x_row[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    dg = tl.zeros([BM], tl.float32)
    if NORM:    # Zm [j, i] = MZ of feature (i, j) (with the key side's multiplicities)
        zm = _zmat(MZ, m_base, D, NT, TW)
        if KEYS:
            zm = zm * _multiplicity(offs_d[:, None], offs_d[None, :] // TW, TW)
        xz = tl.dot(xf, zm + tl.trans(zm), input_precision="tf32x3") * on                    # [BM, D]
        dg = 0.5 * zl * tl.sum(xf * xz, axis=1)
        acc = xz * zl[:, None]
    acc, dg = _rows_grad_pass(acc, dg, a_op, xf, x_row, dx_row, M, m_base, mask, rf, 0, T1 * on, 0, D, NT, TW, D,
                              BM, DOT_DT, PREC, KEYS, ATOMIC, PIPE)
    _rmw(dx_row[:, None] + offs_d[None, :], acc * rf[:, None], mask[:, None], ATOMIC)
    j2 = D - KW2 + tl.arange(0, KW2)
    x2 = tl.load(x_row[:, None] + j2[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    acc2 = tl.zeros([BM, KW2], tl.float32)
    acc2, dg = _rows_grad_pass(acc2, dg, a_op, x2, x_row, dx_row, M, m_base, mask, rf, T1, T1 + (NT - T1) * on,
                               D - KW2, KW2, NT, TW, D, BM, DOT_DT, PREC, KEYS, ATOMIC, PIPE)
    _rmw(dx_row[:, None] + j2[None, :], acc2 * rf[:, None], mask[:, None], ATOMIC)
    return dg


@triton.jit
def _sym2_query_bwd_rows(Q, G, S, Z, DO, LSE, DELTA, DQ, DQO, DGQ, scale_p, T, NC, DS,
                         HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr, TW: tl.constexpr,
                         KW2: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                         HAS_S0: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, ATOMIC: tl.constexpr,
                         PIPE: tl.constexpr = 0, CAST: tl.constexpr = False):
    """_sym2_query_bwd, row-scaled (below config grouped_qbwd_min_d): X = r (dn S_n^T + dl z_n),
    DQ += dphi/dq^T X, DGQ = X . phi; CAST: DQO = DQ in the inputs' dtype."""
    row, mask, r, n, s_base = _query_rows(scale_p, G, T, NC, DS, HQ, HK, C, BM, GATED)
    dn, dl = _query_grad_rows(DO, LSE, DELTA, row, mask, BM, D, NORM)
    dg = _rows_grad(dn.to(DOT_DT), Q + row * D, DQ + row * D, S, Z, s_base, dl, r, mask, KW2, D, TW, BM,
                    _has_state(n, HAS_S0), DOT_DT, PREC, False, ATOMIC, PIPE, NORM)
    if GATED:
        tl.store(DGQ + row, dg * r, mask=mask)
    _cast_rows(DQ, DQO, row, mask, HQ, D, CAST)


# ----------------------------------------------------------------------------------------------
# key side backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _sym2_key_bwd(K, V, G, GRP, DU, DUZ, DK, DKO, DV, DGK, T, NC, DS, NG, NU,
                  HK: tl.constexpr, D: tl.constexpr, C: tl.constexpr, TW: tl.constexpr, JG: tl.constexpr,
                  BK: tl.constexpr, GATED: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr,
                  ATOMIC: tl.constexpr, CAST: tl.constexpr = False):
    """Program (key block of a chunk, chunk n, b*hk): with ph = w phi(k) c_j, c_j = e^(gt_n - g_j) and
    X = v dU_n^T + dUz_n = dL/dph: DK += dph/dk^T X, DGK = -X . ph (dv: _sym2_key_dv_rows, row-scaled; DV unread).
    dU_n is slot n of DU (NU slots per (b, hk)); CAST: DKO = DK in the inputs' dtype."""
    i_b, i_hk, n, pid_bh, rows, mask = _key_block(T, HK, C, BK)
    offs_d = tl.arange(0, D)
    row, kv_off, v, c = _key_rows(V, G, T, i_b, i_hk, n, rows, mask, HK, D, C, GATED)
    u_base = (pid_bh.to(tl.int64) * NU + n) * DS
    y = tl.zeros([BK], tl.float32)
    dk_row = DK + row * D
    for g in range(NG):
        ti, tj, lrow, fvalid, colj, jvalid = _group(GRP, g, TW, JG, D)
        ki, kj = _pair(K + row * D, ti, tj, mask, colj, jvalid, TW)
        wcol = _multiplicity(colj, ti, TW)
        kjw = kj * wcol[None, :]
        du = tl.load(DU + (u_base + lrow)[:, None] * D + offs_d[None, :], mask=fvalid[:, None], other=0.0)
        duz = tl.load(DUZ + u_base + lrow, mask=fvalid, other=0.0)
        x = tl.dot(v.to(DOT_DT), tl.trans(du.to(DOT_DT)), input_precision=PREC) + duz[None, :]   # [BK, FG]
        x3 = tl.reshape(x, (BK, TW, TW * JG))
        dki = tl.sum(x3 * kjw[:, None, :], axis=2)                                          # [BK, 8], / c
        dkj = tl.sum(x3 * ki[:, :, None], axis=1)                                           # [BK, 8JG], / (c w)
        y += tl.sum(ki * dki, axis=1)                                                       # X . ph / c
        _rmw(dk_row[:, None] + ti * TW + tl.arange(0, TW)[None, :], dki * c[:, None], mask[:, None], ATOMIC)
        _rmw(dk_row[:, None] + colj[None, :], dkj * wcol[None, :] * c[:, None], mask[:, None] & jvalid[None, :],
             ATOMIC)
    if GATED:
        tl.store(DGK + row, -y * c, mask=mask)
    _cast_rows(DK, DKO, row, mask, HK, D, CAST)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------
_GROUPS: dict = {}


def groups(d: int, jg: int, device) -> torch.Tensor:
    """(NG, 3) int32 table of (first tile i, first second tile j0, block index l(i, j0)): blocks (i, j >= i) of
    the lexicographic layout, JG consecutive j per group (the last group of a row may run past the tiles)."""
    key = (d, jg, str(device))
    if key not in _GROUPS:
        nt = d // TILE2
        rows, l = [], 0
        for i in range(nt):
            for j0 in range(i, nt, jg):
                rows.append((i, j0, l + (j0 - i)))
            l += nt - i
        _GROUPS[key] = torch.tensor(rows, dtype=torch.int32, device=device).contiguous()
    return _GROUPS[key]


_GLUON_GROUPS: dict = {}


def gluon_groups(d: int, jg: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon outer products' groups: (NG, 3) int32 (row tile ti, column tiles tj, tjb) and (NG, TW * TW * jg)
    int32, per accumulator row a TW jg + c (the product x_(TW ti + a) x_(TW jt + c % TW), jt = tj for c < TW, else
    tjb) its layout row, or -1 where jt is past the tiles (the kernel forms the multiplicities from ti and jt).

    As groups(): JG consecutive column tiles of one row (tjb = tj + 1), product (TW ti + a, TW jt + c) at row
    a TW + c of block l(ti, jt). The rows whose last group would hold one block (tile nt - 1 alone, the other half
    of its matmuls on zeros) give those blocks (i, nt - 1) to groups of two: the products
    of row tile nt - 1 with column tiles i and i', each stored transposed (product (TW (nt-1) + a, TW i + c) is
    feature (TW i + c, TW (nt-1) + a), row c TW + a of block l(i, nt - 1)). d=64 at JG 2: 18 full groups instead of
    20 with 4 half empty."""
    key = (d, jg, str(device))
    if key not in _GLUON_GROUPS:
        nt, tw = d // TILE2, TILE2
        block = {(i, j): l for i, j, l in groups(d, 1, "cpu").tolist()}       # l(i, j) of the layout's blocks
        groups_, alone = [], []
        for i in range(nt):
            for j0 in range(i, nt, jg):
                if jg == 2 and j0 == nt - 1:
                    alone.append(i)
                else:
                    groups_.append((i, j0, j0 + 1, False))
        for k in range(0, len(alone) - 1, 2):
            groups_.append((nt - 1, alone[k], alone[k + 1], True))
        if len(alone) % 2:
            groups_.append((alone[-1], nt - 1, nt, False))
        rows = []
        for ti, tj, tjb, transposed in groups_:
            out = []
            for f in range(tw * tw * jg):
                a, c, jt = f // (tw * jg), f % tw, tjb if f % (tw * jg) >= tw else tj
                if jt >= nt:
                    out.append(-1)
                elif transposed:
                    out.append(block[jt, ti] * tw * tw + c * tw + a)
                else:
                    out.append(block[ti, jt] * tw * tw + a * tw + c)
            rows.append(out)
        _GLUON_GROUPS[key] = (torch.tensor([g[:3] for g in groups_], dtype=torch.int32, device=device),
                              torch.tensor(rows, dtype=torch.int32, device=device))
    return _GLUON_GROUPS[key]


def block_entry(kernel: str, d: int) -> tuple:
    """One Triton kernel's entry for head dim d, (JG, rows, warps, stages[, maxnreg]): config block_override's, else
    the tunables table's sym2_<kernel> row."""
    override = config.current().block_override
    if kernel in override:
        return override[kernel]
    return tunables.tile("sym2_" + kernel, d)


def blocks(kernel: str, d: int):
    """(JG, rows, warps, stages) of one kernel for head dim d."""
    return block_entry(kernel, d)[:4]


def launch_options(kernel: str, d: int) -> dict:
    """num_warps, num_stages and (5th entry) maxnreg of one kernel's launch (_common.launch_options)."""
    return _entry_options(block_entry(kernel, d))


def row_scaled_qbwd(d: int) -> bool:
    """Whether the query backward runs row-scaled (else grouped) for head dim d (config grouped_qbwd_min_d)."""
    return d < config.current().grouped_qbwd_min_d


def atomic_updates() -> bool:
    """Whether this launch of the backward kernels adds dq / dk by atomics (the ATOMIC constexpr)."""
    return config.current().atomic_rmw and not torch.are_deterministic_algorithms_enabled()


def half_window(d: int) -> int:
    """KW2 of the row-scaled kernels: the window of the later half of the first tiles (d/2; d for d < 32,
    where a half window would be below the 16-column minimum of a matmul)."""
    return d // 2 if d >= 32 else d


def gluon_window_min(d: int) -> int:
    """MINW of the Gluon forward-type row kernels (query forward, key dv) for head dim d: config window_min where it
    is a power of two from 16 to d / 2, else half_window(d)."""
    w = config.current().window_min
    if w and w >= 16 and w & (w - 1) == 0 and w <= d // 2:
        return w
    return half_window(d)


def gluon_available() -> bool:
    """Whether this Triton has the Gluon the outer product is written for: 3.6 (run on the H100s) or newer (3.9 builds
    it: compile_check); older ones keep Triton's _sym2_outer."""
    global _GLUON_OK
    if _GLUON_OK is None:
        try:
            major, minor = (int(x) for x in triton.__version__.split(".")[:2])
            from . import gluon_outer  # noqa: F401
            _GLUON_OK = (major, minor) >= (3, 6)
        except (ImportError, AttributeError, ValueError):
            _GLUON_OK = False
    return _GLUON_OK


_GLUON_OK = None


def gluon_outer_applies(X, d: int, C: int) -> bool:
    """Whether the outer products run as gluon_outer.gluon_outer, scanning over the chunks in the same pass (each
    chunk's state written there; the query side reads each forward state S_n before it writes slot n), else as
    Triton's _sym2_outer per chunk and chunk_stages' scan: bf16 on CUDA, its rows per step (gluon_outer_block) a
    multiple of 16 dividing the chunk, a Triton with its Gluon."""
    return gluon_outer_runs(X.is_cuda, X.dtype, d, C)


def gluon_outer_runs(on_cuda: bool, dtype, d: int, C: int) -> bool:
    """gluon_outer_applies for inputs on CUDA (on_cuda) of `dtype` (plan.Plan.kernels asks it without tensors)."""
    bk = gluon_outer_block(d, C)[1]
    return (on_cuda and dtype == torch.bfloat16 and bk % 16 == 0 and C % bk == 0 and d in GLUON_OUTER_DIMS
            and gluon_available())


def gluon_outer_block(d: int, C: int = 1024) -> tuple[int, int]:
    """(JG, rows per step) of the Gluon outer product for head dim d and chunk C (the tunables table's gluon_outer
    row; block_override's "outer", or where the table has no row, the Triton outer product's)."""
    entry = None if "outer" in config.current().block_override else tunables.find("gluon_outer", d, "bf16")
    jg, bk = (entry or blocks("outer", d))[:2]
    while bk > 16 and (C % bk or C // bk < 4):    # 64 rows a step at chunk 128 fails ConvertTritonGPUToLLVM (3.6)
        bk //= 2
    return jg, bk


def gluon_rows_regs(kernel: str) -> dict:
    """Launch options of the Gluon row kernel `kernel` ("qfwd", "qbwd", "kdv", "kdk"): its register cap, if any."""
    cfg = config.current()
    cap = {"qfwd": cfg.qfwd_regs, "qbwd": cfg.qbwd_regs, "kdv": cfg.kdv_regs, "kdk": cfg.kdk_regs}[kernel]
    return {"maxnreg": cap} if cap else {}


def gluon_rows_apply(x, d: int) -> bool:
    """Whether the row kernels (query forward and backward, key dv and dk) run as their Gluon versions in gluon_rows
    (the backward-type ones over the state's symmetric completion): bf16 on CUDA, d = 32 or 64,
    a Triton with its Gluon."""
    return gluon_rows_run(x.is_cuda, x.dtype, d)


def gluon_rows_run(on_cuda: bool, dtype, d: int) -> bool:
    """gluon_rows_apply for inputs on CUDA (on_cuda) of `dtype` (plan.Plan.kernels asks it without tensors)."""
    return on_cuda and dtype == torch.bfloat16 and d in (32, 64) and gluon_available()


def _transposed(X, T, hx, d):
    """The (b, hx, d, T) copy of X (b, T, hx, d) that _sym2_outer reads (_transpose_heads)."""
    XT = torch.empty(X.shape[0], hx, d, T, device=X.device, dtype=X.dtype)
    bt, warps = config.current().transpose_block
    _transpose_heads[(triton.cdiv(T, bt), X.shape[0] * hx)](X, XT, T, H=hx, D=d, BT=bt, num_warps=warps)
    return XT


_SIDE_STREAMS: dict = {}


def side_stream(device, role: str) -> torch.cuda.Stream:
    """One stream per device and role ("bwd": the chunked backward's second chain; "norm": the normalizer beside the
    Gluon outer products), created once (streams are not freed)."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if (idx, role) not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx, role] = torch.cuda.Stream(device=idx)
    return _SIDE_STREAMS[idx, role]


def norm_sums_chunks(C: int, NC: int) -> int:
    """Chunks per _norm_chunk_sums program: the most that divide NC and hold at most config norm_sums_rows rows."""
    return max(c for c in range(1, max(1, config.current().norm_sums_rows // C) + 1) if NC % c == 0)


def norm_sums_options(d: int) -> dict:
    """num_warps and num_stages of _norm_chunk_sums (the tunables table's norm_chunk_sums row)."""
    warps, stages = tunables.tile("norm_chunk_sums", d)
    return dict(num_warps=warps, num_stages=stages)


def norm_scan_rows(d: int) -> int:
    """BI of _norm_scan: rows of the dense normalizer per program (the table's norm_scan row, at most d)."""
    return min(tunables.tile("norm_scan", d)[0], d)


def launch_norm_scan(XT, W, G, OUTZ, ZF, T, NC, DS, slot, hx, hk, d, C, keys, norm, gated, du_mult):
    """The normalizer half of gluon_outer's SCAN as two Triton kernels: each chunk's sums in
    matrix form from the scaled copy XT (b, hx, d, T) (and the query side's weights W), then their gated cumulative
    sum into the packed OUTZ. Returns the query side's gated (b, hk, NC) part of dgt (else None)."""
    b = XT.shape[0]
    sums = keys or norm
    zc = XT     # unread without sums (SUMS False)
    if sums:
        zc = torch.empty(b * hk, NC, d, d, device=XT.device, dtype=torch.float32)
        # (gluon_outer runs only for C % 16 == 0)
        bk = next(r for r in (config.current().norm_sums_bk, 32, 16) if C % r == 0)
        cpp = norm_sums_chunks(C, NC)
        _norm_chunk_sums[(NC // cpp, b * hk)](XT, W, zc, T, NC, HX=hx, HK=hk, D=d, C=C, BK=bk, WEIGHTED=not keys,
                                              CPP=cpp, **norm_sums_options(d))
    bi = norm_scan_rows(d)
    dgt = None
    if gated and not keys:
        dgt = torch.empty(b * hk, d // bi, NC, device=XT.device, dtype=torch.float32)
    _norm_scan[(b * hk, d // bi)](zc, G, OUTZ, OUTZ if ZF is None else ZF, OUTZ if dgt is None else dgt, T, NC, DS,
                                  slot, HK=hk, D=d, C=C, NT=d // TILE2, TW=TILE2, BI=bi, KEYS=keys, GATED=gated,
                                  DU_MULT=du_mult and not keys, SUMS=sums, AHEAD=config.current().norm_scan_ahead,
                                  num_warps=4)
    return None if dgt is None else dgt.view(b, hk, d // bi, NC).sum(2)


def scaled_copy_buffers(X, T, hx, d, norm, keys):
    """(XT, W) for gluon_outer: the (b, hx, d, T) scaled copy of X (b, T, hx, d) and the query side's normalizer
    weights (b, T, hx, 8) (X itself, unread, for keys or without norm), written by the chunked form's intra-chunk
    attention kernels (the keys' by the forward, the queries' by dq)."""
    XT = torch.empty(X.shape[0], hx, d, T, device=X.device, dtype=X.dtype)
    W = torch.empty(X.shape[0], T, hx, 8, device=X.device, dtype=X.dtype) if norm and not keys else X
    return XT, W


def launch_outer(X, Y, G, LSE, DELTA, OUT, OUTZ, scale_p, T, NC, DS, slot, hx, hk, d, C, keys, norm, gated,
                 dot_dt, prec, fwd_states=None, du_mult=False, copy=None):
    """Sums of phi(x) y^T over each chunk into slots slot..slot+NC-1 of OUT/OUTZ (b, hk, NC+1, DS, d): the update
    states (keys) or the query-side state gradients. Where gluon_outer_applies, the gated cumulative sum over chunks
    is done in the same pass (gluon_outer's SCAN: slot 0 / slot NC must hold the state entering the scan;
    fwd_states = (S, Z), the forward's states, for the query side's dgt; du_mult: the query side writes dU with the
    key side's multiplicities; copy: (XT, W) of scaled_copy_buffers, already written by the intra-chunk attention),
    else the caller runs chunk_stages.scan_states / scan_state_grads. Returns (scanned, dgt): whether it scanned and
    the (b, hk, NC) gate gradient of the gated query side's scan (else None)."""
    cfg = config.current()
    jg, bk, _, _ = blocks("outer", d)
    if gluon_outer_applies(X, d, C):
        jg, bk = gluon_outer_block(d, C)
        grp, grows = gluon_groups(d, jg, X.device)
        from .gluon_outer import gluon_outer, operand_layout_3d
        XT, W = copy
        dgt = None
        if gated and not keys:
            dgt = torch.empty(X.shape[0] * hk, grp.shape[0], NC, device=X.device, dtype=torch.float32)
        sf, zf = fwd_states or (OUT, OUTZ)
        # the normalizer apart (launch_norm_scan; outer products 12.25 -> 9.58 ms), on a side stream beside the outer
        # products (it reads only the copies, G and the forward's z; its buffers are allocated there): the
        # memory-bound sums fill the SMs the outer products' last wave leaves
        side = side_stream(X.device, "norm")
        side.wait_stream(torch.cuda.current_stream(X.device))
        gluon_outer[(grp.shape[0], 1, X.shape[0] * hk)](
            XT, Y, W, grp, grows, OUT, OUTZ, T, NC, DS, slot, HX=hx, HK=hk, D=d, C=C, TW=TILE2, JG=jg, BK=bk,
            KEYS=keys, NORM=norm, NBUF=cfg.outer_stages, L3=operand_layout_3d(TILE2, TILE2 * jg, bk), num_warps=4,
            G=G, SF=sf, ZF=zf, DGT=OUTZ if dgt is None else dgt, GATED=gated, DU_MULT=du_mult and not keys,
            **({"maxnreg": cfg.outer_scan_regs} if cfg.outer_scan_regs else {}))
        if dgt is not None:
            dgt = dgt.view(X.shape[0], hk, grp.shape[0], NC).sum(2)
        with torch.cuda.stream(side):
            dgt_z = launch_norm_scan(XT, W, G, OUTZ, (fwd_states or (None, None))[1], T, NC, DS, slot, hx, hk, d, C,
                                     keys, norm, gated, du_mult)
        # joined: nothing it reads or writes is touched by the caller's stream meanwhile
        torch.cuda.current_stream(X.device).wait_stream(side)
        if dgt_z is not None:
            dgt = dgt + dgt_z
        return True, dgt
    grp = groups(d, jg, X.device)
    X = _transposed(X, T, hx, d)
    _sym2_outer[(grp.shape[0], NC, X.shape[0] * hk)](
        X, Y, G, LSE, DELTA, grp, OUT, OUTZ, scale_p, T, NC, DS, slot, HX=hx, HK=hk, D=d, C=C, TW=TILE2, JG=jg, BK=bk,
        KEYS=keys, NORM=norm, GATED=gated, DOT_DT=dot_dt, PREC=prec, **launch_options("outer", d))
    return False, None
