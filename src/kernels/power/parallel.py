"""Attention form of power attention in Triton: flash-like forward, one-kernel backward (dq by atomics).

Forward, per (query block, batch*q-head): loop over causal key blocks,
    a_ij = (s q_i.k_j)^p * exp(G_i - G_j)        (fp32; powers by multiplication)
acc += a @ v, l += rowsum(a); y = acc / l, lse_i = log l_i (the log-normalizer, for the backward).
Even p makes a >= 0 and bf16/fp32 operands have fp32's range, so no running max and no log-space power are
needed. Key blocks strictly before the query block take a fast path with no mask and no exp per element:
exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j) (r = last key before the block, both factors <= 1), the key
factor multiplying the scores, the query factor and s^p applied once after the loop. fp16 operands
(range 65504) instead keep a running row max in the linear domain (acc *= m_old/m_new, a/m <= 1) on every block.

Backward (D_i = normalizer, Delta_i = dy_i . y_i):
    dA_ij = (dy_i . v_j - Delta_i) / D_i            (norm=False: dA_ij = dy_i . v_j)
    dS_ij = dA_ij * p (s q_i.k_j)^(p-1) exp(G_i - G_j) * s
    dq = dS k, dk = dS^T q, dv = (a / D)^T dy,
    dG_i += sum_j dA_ij a_ij = q_i . dq_i / p,   dG_j -= sum_i dA_ij a_ij = -k_j . dk_j / p
dS and a / D come from one factor per tile, w_ij = p x_ij^(p-1) exp(G_i - G_j) s^p / D_i with x = q_i.k_j unscaled:
dS = dA_ij D_i w_ij, and w x is p times the weights (dv is divided by p at the end).
The gate gradients use Euler's identity (a_ij is homogeneous of degree p in q_i and in k_j): one row dot product
in each kernel's epilogue instead of a row or column reduction of a [BM, BN] tile per block (the column sums of
the key kernel crossed warps through shared memory on every block).
One kernel per key block (dk, dv, dG_k; loops over the query heads of its GQA group, so no atomics for them) also
adds each dS tile's share of dq into an fp32 buffer by atomics (ATOMIC_DQ: five tile matmuls per block pair against
seven in two kernels, which recompute the scores and dy.v; a pass before forms Delta and zeroes the buffer, one after
casts dq and forms dG_q). torch's deterministic mode, and the chunked form's intra-chunk attention (whose dq kernel
also writes the queries' scaled copy), run the two-kernel backward: the key-block kernel and one per query block
(dq, dG_q).
"""
from __future__ import annotations

import contextvars
import functools
import os

import torch
import triton
import triton.language as tl


from . import config, gates, tunables
from ._common import _exp, _kv_heads, _query_heads, _store_norm_weights, _store_transposed, launch_options


@triton.jit
def _pow(s, P: tl.constexpr):
    """s**P for P in 0..4 by multiplication."""
    if P == 0:
        r = tl.full(s.shape, 1.0, tl.float32)
    elif P == 1:
        r = s
    elif P == 2:
        r = s * s
    elif P == 3:
        r = s * s * s
    else:
        s2 = s * s
        r = s2 * s2
    return r


@triton.jit
def _in_range(offs, T, EVEN: tl.constexpr):
    """offs < T; EVEN (T a multiple of every tile: the chunked form's chunks) a constant true, so the masks built from
    it fold away (no compare or predicate per element)."""
    if EVEN:
        m = tl.full(offs.shape, 1, tl.int1)
    else:
        m = offs < T
    return m


@triton.jit
def _xt_rows(XT, i_cb, i_h, CB0, NCH, T_FULL, C, H: tl.constexpr, D: tl.constexpr):
    """XT_ROWS of _store_transposed for a chunked-form attention program on chunk-batch entry i_cb of a launch
    starting at entry CB0 (NCH chunks of C rows per sequence of T_FULL): head i_h's plane of the (b, H, D, T_FULL)
    copy, at the chunk's first row."""
    i_cg = CB0 + i_cb
    return XT + ((i_cg // NCH) * H + i_h) * D * T_FULL + (i_cg % NCH) * C


@triton.jit
def _attn_fwd(Q, K, V, G, O, LSE, scale, scale_p, T,
              HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
              NORM: tl.constexpr, GATED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              DOT_DT: tl.constexpr, PREC: tl.constexpr, FAST: tl.constexpr,
              XT=None, CB0=0, NCH=1, T_FULL=0, XT_MODE: tl.constexpr = 0, FTZ: tl.constexpr = False,
              EVEN: tl.constexpr = False):
    """XT_MODE 1 (the chunked form, each chunk a batch entry of T = C rows): the first query head of each GQA group
    also writes its block's keys, times e^((gt - g_j) / 2) (gt: G at the chunk's last row), into XT, the
    (b, hk, D, T_FULL) copy the Gluon outer products read (chunk_p2/gluon_outer.py), so that
    copy needs no pass of its own (_xt_rows: CB0, NCH, T_FULL). With the fast paths (FAST, NORM) the
    normalizer's row sums of the rounded weights by one more small matmul, a [BN, 16] operand of ones in its first
    column, instead of widening each weight back to fp32 and adding it (the kernel is issue-bound: ncu,
    70% of issue slots busy, the tensor pipe 25%)."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)                   # causal: longest rows launch first
    i_b, i_hq, i_hk = _query_heads(tl.program_id(1), HQ, HK)
    offs_m = pid_m * BM + tl.arange(0, BM)                               # [BM]
    offs_d = tl.arange(0, D)                                             # [D]
    mask_m = _in_range(offs_m, T, EVEN)
    q = tl.load(Q + i_b * T * HQ * D + offs_m[:, None] * (HQ * D) + i_hq * D + offs_d[None, :],
                mask=mask_m[:, None], other=0.0).to(DOT_DT)              # [BM, D]
    k_base = K + i_b * T * HK * D + i_hk * D
    v_base = V + i_b * T * HK * D + i_hk * D
    g_base = G + i_b * T * HK + i_hk
    if GATED:
        g_q = tl.load(g_base + offs_m * HK, mask=mask_m, other=0.0)     # [BM]
    if XT_MODE == 1:    # before the key loop, as dq's copy
        if i_hq % (HQ // HK) == 0:
            kx = tl.load(k_base + offs_m[:, None] * (HK * D) + offs_d[None, :], mask=mask_m[:, None], other=0.0)
            f = tl.full([BM], 1.0, tl.float32)
            if GATED:
                f = tl.exp(0.5 * (tl.load(g_base + (T - 1) * HK) - g_q))
            _store_transposed(kx, f, _xt_rows(XT, i_b, i_hk, CB0, NCH, T_FULL, T, HK, D), T_FULL, offs_m, mask_m, D)
    m_i = tl.full([BM], 1e-30, tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    RS: tl.constexpr = FAST and NORM
    if RS:
        ones = ((tl.arange(0, BN)[:, None] >= 0) & (tl.arange(0, 16)[None, :] == 0)).to(DOT_DT)   # [BN, 16]
        l_mma = tl.zeros([BM, 16], tl.float32)                           # row sums in column 0, zeros beside
    hi = tl.minimum((pid_m + 1) * BM, T)
    lo = 0
    if FAST:
        # Off-diagonal key blocks (all keys before this query block), no mask, no exp per element:
        # exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j) with r = the last key before the block, both
        # factors <= 1; the key factor multiplies the scores (k stays a plain loaded operand), the query factor
        # and s^p are applied once after the loop. bf16/fp32 operands only:
        # a = (q.k)^p needs no running max (fp32's range); fp16 takes the running-max loop below for all blocks.
        lo = pid_m * BM
        if GATED:
            g_r = tl.load(g_base + tl.maximum(lo - 1, 0) * HK)
        for start_n in range(0, lo, BN):
            offs_n = start_n + tl.arange(0, BN)
            k = tl.load(k_base + offs_n[:, None] * (HK * D) + offs_d[None, :]).to(DOT_DT)
            v = tl.load(v_base + offs_n[:, None] * (HK * D) + offs_d[None, :]).to(DOT_DT)
            if GATED:
                g_k = tl.load(g_base + offs_n * HK)
            a = _pow(tl.dot(q, tl.trans(k), input_precision=PREC), P)    # [BM, BN]
            if GATED:   # the key factor on the scores: k stays a plain loaded operand
                a = a * _exp(g_r - g_k, FTZ)[None, :]
            a = a.to(DOT_DT)
            if RS:
                l_mma = tl.dot(a, ones, l_mma, input_precision=PREC)
            elif NORM:
                l_i += tl.sum(a.to(tl.float32), axis=1)                  # the rounded weights: see below
            acc += tl.dot(a, v, input_precision=PREC)
        if RS:
            l_i = tl.sum(l_mma, axis=1)
            l_mma = tl.zeros([BM, 16], tl.float32)
        row_f = tl.full([BM], 1.0, tl.float32) * scale_p
        if GATED:
            row_f = row_f * _exp(g_q - g_r, FTZ)
        row_f = tl.where(mask_m, row_f, 0.0)                             # padded rows: exp(-g_r) may be inf
        acc = acc * row_f[:, None]
        l_i = l_i * row_f
    for start_n in range(lo, hi, BN):
        offs_n = start_n + tl.arange(0, BN)                              # [BN]
        mask_n = _in_range(offs_n, T, EVEN)
        k = tl.load(k_base + offs_n[:, None] * (HK * D) + offs_d[None, :], mask=mask_n[:, None],
                    other=0.0).to(DOT_DT)                                # [BN, D]
        v = tl.load(v_base + offs_n[:, None] * (HK * D) + offs_d[None, :], mask=mask_n[:, None],
                    other=0.0).to(DOT_DT)                                # [BN, D]
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale         # [BM, BN] fp32
        causal = (offs_m[:, None] >= offs_n[None, :]) & mask_n[None, :]
        if GATED:
            g_k = tl.load(g_base + offs_n * HK, mask=mask_n, other=0.0)
            a = _pow(s, P) * _exp(tl.where(causal, g_q[:, None] - g_k[None, :], float("-inf")), FTZ)
        else:
            a = tl.where(causal, _pow(s, P), 0.0)
        if NORM and not FAST:
            m_new = tl.maximum(m_i, tl.max(a, axis=1))
            alpha = m_i / m_new
            a = a * (1.0 / m_new)[:, None]
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        # the normalizer sums the weights as rounded for the matmul: y is then an exact convex combination of
        # the v rows, so Delta = dy . y matches the backward's weights. With fp32 sums of unrounded weights, a
        # row with one key and a tiny score (y_0 = v_0 exactly) got a spurious dq ~ 2^-9 |dy||v| / s
        # (bf16 d=32 dq/dk errors of 2e-2 for some draws on the H200)
        a = a.to(DOT_DT)
        if RS:
            l_mma = tl.dot(a, ones, l_mma, input_precision=PREC)
        elif NORM:
            l_i += tl.sum(a.to(tl.float32), axis=1)
        acc += tl.dot(a, v, input_precision=PREC)
    if RS:
        l_i += tl.sum(l_mma, axis=1)
    o_ptrs = O + i_b * T * HQ * D + offs_m[:, None] * (HQ * D) + i_hq * D + offs_d[None, :]
    if NORM and FAST:
        l_i = tl.maximum(l_i, 1e-30)                                     # all-zero row -> y = 0
        acc = acc / l_i[:, None]
        tl.store(LSE + i_b * T * HQ + offs_m * HQ + i_hq, tl.log(l_i), mask=mask_m)
    if NORM and not FAST:
        acc = acc / (l_i + 1e-6)[:, None]
        tl.store(LSE + i_b * T * HQ + offs_m * HQ + i_hq, tl.log(m_i) + tl.log(l_i + 1e-6), mask=mask_m)
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=mask_m[:, None])


@triton.jit
def _query_tile(Q, DO, LSE, DELTA, G, i_b, i_hq, i_hk, offs_m, T, HQ: tl.constexpr, HK: tl.constexpr,
                D: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, DOT_DT: tl.constexpr,
                O=None, DELTA_OUT: tl.constexpr = False, EVEN: tl.constexpr = False):
    """Query rows offs_m of head i_hq for a backward kernel: q and dy (operand dtype), lse, Delta and G_q (zeros when
    unused), the rows' mask and their [BM, D] offsets. DELTA_OUT: Delta = dy . y is formed here from dy and the
    output O (fp32 products and sum) and stored to DELTA for the kernels after this one (no separate pass)."""
    offs_d = tl.arange(0, D)
    mask_m = _in_range(offs_m, T, EVEN)
    q_off = i_b * T * HQ * D + offs_m[:, None] * (HQ * D) + i_hq * D + offs_d[None, :]
    q = tl.load(Q + q_off, mask=mask_m[:, None], other=0.0).to(DOT_DT)
    do_in = tl.load(DO + q_off, mask=mask_m[:, None], other=0.0)
    do = do_in.to(DOT_DT)
    row = i_b * T * HQ + offs_m * HQ + i_hq
    lse = tl.zeros([BM], tl.float32)
    delta = tl.zeros([BM], tl.float32)
    if NORM:
        lse = tl.load(LSE + row, mask=mask_m, other=0.0)
        if DELTA_OUT:
            y = tl.load(O + q_off, mask=mask_m[:, None], other=0.0).to(tl.float32)
            delta = tl.sum(do_in.to(tl.float32) * y, axis=1)
            tl.store(DELTA + row, delta, mask=mask_m)
        else:
            delta = tl.load(DELTA + row, mask=mask_m, other=0.0)
    g_q = tl.zeros([BM], tl.float32)
    if GATED:
        g_q = tl.load(G + i_b * T * HK + offs_m * HK + i_hk, mask=mask_m, other=0.0)
    return q, do, lse, delta, g_q, mask_m, q_off


@triton.jit
def _attn_tile_grads(q, k, v, do, lse, delta, g_q, g_k, causal, scale_p,
                     P: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
                     FTZ: tl.constexpr = False):
    """Shared tile math of both backward kernels: returns (pn, ds), both [BM, BN] fp32, from one factor
    w = x^(p-1) e p s^p / D_i of the unscaled scores x: pn = w x is p times the weights (the dk/dv kernel divides dv
    by p at its end) and dS = (dy_i.v_j - Delta_i) w: four multiplies per element at p=2 where separate products took
    seven."""
    if GATED:
        e = _exp(tl.where(causal, g_q[:, None] - g_k[None, :], float("-inf")), FTZ)
    else:
        e = tl.where(causal, 1.0, 0.0)
    x = tl.dot(q, tl.trans(k), input_precision=PREC)
    r = tl.full(lse.shape, P * scale_p, tl.float32)
    if NORM:
        r = r * tl.exp(-lse)
    w = _pow(x, P - 1) * e * r[:, None]
    da = tl.dot(do, tl.trans(v), input_precision=PREC)
    if NORM:
        da = da - delta[:, None]
    return w * x, da * w


@triton.jit
def _add_dq(DQA, dqa_desc, q_off, i_b, start_m, i_hq, part, mask_m, BM: tl.constexpr, D: tl.constexpr,
            TMA_DQ: tl.constexpr):
    """dq rows += part (fp32: the order of the adds varies, so the last bits do; deterministic mode keeps the
    two-kernel backward). part = dS k_f: phase 1's k_f is k (SHARED_ROUND, or ungated) or k times the key factor's
    p-th root, which is exactly the share of the factor its dS tile lacks, so dS k_f is dq either way.
    TMA_DQ: the whole tile by one bulk reduction (cp.reduce.async.bulk.tensor; the descriptor's shape clips the rows
    past T), else relaxed per-element atomics."""
    if TMA_DQ:
        dqa_desc.atomic_add([i_b.to(tl.int32), start_m, i_hq * D], part.reshape(1, BM, D))   # i_b: int64
    else:
        tl.atomic_add(DQA + q_off, part, mask=mask_m[:, None], sem="relaxed")


@triton.jit
def _attn_bwd_prep(O, DO, DELTA, DQA, T, HQ: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr):
    """Before the one-kernel backward (ATOMIC_DQ), per query block: Delta = dy . y (fp32 products and sum, as
    _query_tile's DELTA_OUT) and the block's rows of the dq accumulator DQA zeroed (no memset launch of its own)."""
    pid_m = tl.program_id(0)
    i_b, i_hq, _ = _query_heads(tl.program_id(1), HQ, HQ)
    offs_m = pid_m * BM + tl.arange(0, BM)
    mask_m = offs_m < T
    off = i_b * T * HQ * D + offs_m[:, None] * (HQ * D) + i_hq * D + tl.arange(0, D)[None, :]
    if NORM:
        do = tl.load(DO + off, mask=mask_m[:, None], other=0.0).to(tl.float32)
        y = tl.load(O + off, mask=mask_m[:, None], other=0.0).to(tl.float32)
        tl.store(DELTA + i_b * T * HQ + offs_m * HQ + i_hq, tl.sum(do * y, axis=1), mask=mask_m)
    tl.store(DQA + off, tl.zeros([BM, D], tl.float32), mask=mask_m[:, None])


@triton.jit
def _attn_bwd_dq_finish(Q, DQA, DQ, DGQ, T, HQ: tl.constexpr, D: tl.constexpr, P: tl.constexpr, BM: tl.constexpr,
                        GATED: tl.constexpr, DOT_DT: tl.constexpr):
    """After the one-kernel backward: dq in its dtype from the fp32 accumulator, and the query side's gate gradient
    q . dq / p (Euler, as _attn_bwd_dq's epilogue, with q as the matmuls read it)."""
    pid_m = tl.program_id(0)
    i_b, i_hq, _ = _query_heads(tl.program_id(1), HQ, HQ)
    offs_m = pid_m * BM + tl.arange(0, BM)
    mask_m = offs_m < T
    off = i_b * T * HQ * D + offs_m[:, None] * (HQ * D) + i_hq * D + tl.arange(0, D)[None, :]
    dq = tl.load(DQA + off, mask=mask_m[:, None], other=0.0)
    tl.store(DQ + off, dq.to(DQ.dtype.element_ty), mask=mask_m[:, None])
    if GATED:
        q = tl.load(Q + off, mask=mask_m[:, None], other=0.0).to(DOT_DT).to(tl.float32)
        tl.store(DGQ + i_b * T * HQ + offs_m * HQ + i_hq, tl.sum(q * dq, axis=1) * (1.0 / P), mask=mask_m)


@triton.jit
def _attn_bwd_dkdv(Q, K, V, G, DO, LSE, DELTA, DK, DV, DGK, scale, scale_p, T,
                   HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                   NORM: tl.constexpr, GATED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   DOT_DT: tl.constexpr, PREC: tl.constexpr, FAST: tl.constexpr, OFFDIAG_FP32: tl.constexpr = False,
                   OFFDIAG_PREC: tl.constexpr = "tf32x3", SHARED_ROUND: tl.constexpr = False,
                   DQA=None, ATOMIC_DQ: tl.constexpr = False, TMA_DQ: tl.constexpr = False,
                   FTZ: tl.constexpr = False, EVEN: tl.constexpr = False):
    """ATOMIC_DQ (the one-kernel backward, config.attention's fused_backward): each dS tile also gives its query rows'
    share of dq, dS k, added into DQA (fp32 (b, t, hq, d), zeroed by _attn_bwd_prep) by relaxed atomics; dq is then
    rounded from the very dS tiles dk is (no second kernel recomputing the scores and dy.v), and _attn_bwd_dq_finish
    casts it and forms the query side's gate gradient. TMA_DQ (sm_90+, not the interpreter): each tile's adds as one
    bulk tensor reduction through a descriptor made here (Triton's scratch allocator holds it).
    OFFDIAG_FP32: phase 1's gate-scaled keys and dS tiles stay fp32 (matmuls at OFFDIAG_PREC), as in _attn_bwd_dq
    (config.attention's offdiag_fp32_grads and offdiag_precision). SHARED_ROUND (gated; the attention form's
    backward, backward_rounding): phase 1 keeps k as loaded and puts the whole key factor e^(G_r - G_j) into the P
    and dS tiles, so its dS tile is, bit for bit, the one _attn_bwd_dq rounds (same reference key r, same product order)."""
    pid_n = tl.program_id(0)
    i_b, i_hk = _kv_heads(tl.program_id(1), HK)
    REP: tl.constexpr = HQ // HK
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    mask_n = _in_range(offs_n, T, EVEN)
    kv_off = i_b * T * HK * D + offs_n[:, None] * (HK * D) + i_hk * D + offs_d[None, :]
    v = tl.load(V + kv_off, mask=mask_n[:, None], other=0.0).to(DOT_DT)
    g_k = tl.zeros([BN], tl.float32)
    if GATED:
        g_k = tl.load(G + i_b * T * HK + offs_n * HK + i_hk, mask=mask_n, other=0.0)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    dqa_desc = DQA
    if TMA_DQ:      # DQA as (b, t, hq * d): a tile is [1, BM, D] at (i_b, start_m, i_hq * D)
        dqa_desc = tl.make_tensor_descriptor(DQA, shape=[tl.num_programs(1) // HK, T, HQ * D],
                                             strides=[tl.cast(T, tl.int64) * (HQ * D), HQ * D, 1],
                                             block_shape=[1, BM, D])
    lo = (pid_n * BN // BM) * BM
    hi_diag = T
    if FAST:
        # the query blocks that meet this key block's diagonal: one when BM % BN == 0, BN / BM when BN % BM == 0
        DIAG: tl.constexpr = BM if BM >= BN else BN
        hi_diag = tl.minimum(lo + DIAG, T)
        # Phase 1, off-diagonal query blocks (all queries after every key here) of every head of the GQA group:
        # exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j), r = the block's last key; the key factor goes into k
        # (p-th root, once per program), so dv is exact and dk is dk_f times that root. Plain k is
        # reloaded for phase 2: only one of k / k_f and one dk accumulator is ever live (fewer spills).
        k_f = tl.load(K + kv_off, mask=mask_n[:, None], other=0.0).to(tl.float32)
        g_r = tl.zeros([1], tl.float32)
        if GATED:
            g_r = tl.load(G + i_b * T * HK + tl.minimum(pid_n * BN + BN - 1, T - 1) * HK + i_hk)
            if SHARED_ROUND:
                c_k = _exp(g_r - g_k, FTZ)                               # [BN] <= 1, into the P and dS tiles
            else:
                c_k = tl.exp((g_r - g_k) * (1.0 / P))                    # [BN] <= 1
                k_f = k_f * c_k[:, None]
        if not OFFDIAG_FP32:
            k_f = k_f.to(DOT_DT)
        for r in range(REP):
            i_hq = i_hk * REP + r
            for start_m in range(lo + DIAG, T, BM):
                offs_m = start_m + tl.arange(0, BM)
                mask_m = _in_range(offs_m, T, EVEN)
                q_off = i_b * T * HQ * D + offs_m[:, None] * (HQ * D) + i_hq * D + offs_d[None, :]
                q = tl.load(Q + q_off, mask=mask_m[:, None], other=0.0).to(tl.float32 if OFFDIAG_FP32 else DOT_DT)
                do = tl.load(DO + q_off, mask=mask_m[:, None], other=0.0).to(DOT_DT)
                row = i_b * T * HQ + offs_m * HQ + i_hq
                r_q = tl.full([BM], 1.0, tl.float32) * scale_p            # R_i = s^p rowf_i / D_i
                if NORM:
                    r_q = r_q * tl.exp(-tl.load(LSE + row, mask=mask_m, other=0.0))
                if GATED:
                    g_q = tl.load(G + i_b * T * HK + offs_m * HK + i_hk, mask=mask_m, other=0.0)
                    r_q = r_q * _exp(g_q - g_r, FTZ)
                r_q = tl.where(mask_m, r_q, 0.0)                             # padded rows: exp(-g_r) may be inf
                x = tl.dot(q, tl.trans(k_f), input_precision=OFFDIAG_PREC if OFFDIAG_FP32 else PREC)   # [BM, BN]
                xp1 = _pow(x, P - 1)
                # one factor for both tiles, as _attn_tile_grads (pn: p times the weights); SHARED_ROUND: the
                # product order of _attn_bwd_dq's
                if SHARED_ROUND:
                    w = xp1 * c_k[None, :] * (P * r_q)[:, None]
                else:
                    w = xp1 * (P * r_q)[:, None]
                pn = w * x
                dv += tl.dot(tl.trans(pn.to(DOT_DT)), do, input_precision=PREC)
                da = tl.dot(do, tl.trans(v), input_precision=PREC)
                if NORM:
                    da = da - tl.load(DELTA + row, mask=mask_m, other=0.0)[:, None]
                ds = da * w
                if OFFDIAG_FP32:
                    dk += tl.dot(tl.trans(ds), q, input_precision=OFFDIAG_PREC)
                    if ATOMIC_DQ:
                        _add_dq(DQA, dqa_desc, q_off, i_b, start_m, i_hq,
                                tl.dot(ds, k_f, input_precision=OFFDIAG_PREC), mask_m, BM, D, TMA_DQ)
                else:
                    ds = ds.to(DOT_DT)
                    dk += tl.dot(tl.trans(ds), q, input_precision=PREC)
                    if ATOMIC_DQ:   # dS k_f is dq: k_f carries the key factor ds lacks (docstring of _add_dq)
                        _add_dq(DQA, dqa_desc, q_off, i_b, start_m, i_hq, tl.dot(ds, k_f, input_precision=PREC),
                                mask_m, BM, D, TMA_DQ)
        if GATED and not SHARED_ROUND:
            dk = dk * c_k[:, None]
    # Phase 2, the diagonal query block(s) (every query block when not FAST)
    k = tl.load(K + kv_off, mask=mask_n[:, None], other=0.0).to(DOT_DT)  # [BN, D]
    for r in range(REP):
        i_hq = i_hk * REP + r
        for start_m in range(lo, hi_diag, BM):
            offs_m = start_m + tl.arange(0, BM)
            q, do, lse, delta, g_q, mask_m, q_off = _query_tile(Q, DO, LSE, DELTA, G, i_b, i_hq, i_hk, offs_m, T,
                                                                HQ, HK, D, BM, NORM, GATED, DOT_DT, EVEN=EVEN)
            causal = (offs_m[:, None] >= offs_n[None, :]) & mask_m[:, None] & mask_n[None, :]
            pn, ds = _attn_tile_grads(q, k, v, do, lse, delta, g_q, g_k, causal, scale_p, P, NORM, GATED, PREC,
                                      FTZ)
            dv += tl.dot(tl.trans(pn.to(DOT_DT)), do, input_precision=PREC)
            ds = ds.to(DOT_DT)
            dk += tl.dot(tl.trans(ds), q, input_precision=PREC)
            if ATOMIC_DQ:
                _add_dq(DQA, dqa_desc, q_off, i_b, start_m, i_hq, tl.dot(ds, k, input_precision=PREC), mask_m,
                        BM, D, TMA_DQ)
    dv = dv * (1.0 / P)                      # the weights' tiles were p times theirs (exact for p = 2, 4)
    tl.store(DK + kv_off, dk.to(DK.dtype.element_ty), mask=mask_n[:, None])
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=mask_n[:, None])
    if GATED:
        dg = -tl.sum(k.to(tl.float32) * dk, axis=1) * (1.0 / P)           # Euler (module docstring)
        tl.store(DGK + i_b * T * HK + offs_n * HK + i_hk, dg, mask=mask_n)


@triton.jit
def _attn_bwd_dq(Q, K, V, G, DO, LSE, DELTA, DQ, DGQ, scale, scale_p, T,
                 HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                 NORM: tl.constexpr, GATED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 DOT_DT: tl.constexpr, PREC: tl.constexpr, FAST: tl.constexpr,
                 O=None, DELTA_OUT: tl.constexpr = False, XT=None, W=None, sqrt_scale_p=1.0, CB0=0, NCH=1, T_FULL=0,
                 XT_MODE: tl.constexpr = 0, OFFDIAG_FP32: tl.constexpr = False,
                 OFFDIAG_PREC: tl.constexpr = "tf32x3", SHARED_ROUND: tl.constexpr = False,
                 FTZ: tl.constexpr = False, EVEN: tl.constexpr = False):
    """XT_MODE 2 (the chunked form, each chunk a batch entry of T = C rows): the block's queries, times
    (s^p e^(g_i - lse_i))^(1/2) (sqrt_scale_p = s^(p/2); lse with NORM), also go into XT, the (b, hq, D, T_FULL)
    copy the Gluon outer products read, and with NORM the rows' weights [hi, lo] of -Delta into W (chunk view of
    (b, T_FULL, hq, 8)), without a pass of their own.
    OFFDIAG_FP32 (config.attention's offdiag_fp32_grads): the off-diagonal blocks' dS tiles stay fp32 for their
    matmul with k (tf32x3), as do the key kernel's. d(log g) sums, from the end of the sequence, the query side's
    and the key side's gate terms, which cancel: on the diagonal both kernels round the same dS tile to bf16, so
    those roundings cancel too, but the off-diagonal paths round differently scaled tiles (and the key kernel the
    gate-scaled keys), which do not (docs/kernels.md, Numerics).
    SHARED_ROUND (gated): each off-diagonal key block takes the key kernel's reference (its last key r)
    and the row factor goes into the tile before it is rounded, dS_ij = dA x^(p-1) e^(G_r - G_j) p R_i with
    R_i = s^p e^(G_i - G_r) / D_i: both kernels round the same fp32 tile, so those roundings cancel in d(log g) as
    the diagonal's do (BM and BN alike in both kernels). Costs BM exps and one multiply per tile."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)                   # causal: longest rows launch first
    i_b, i_hq, i_hk = _query_heads(tl.program_id(1), HQ, HK)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q, do, lse, delta, g_q, mask_m, q_off = _query_tile(Q, DO, LSE, DELTA, G, i_b, i_hq, i_hk, offs_m, T, HQ, HK, D,
                                                        BM, NORM, GATED, DOT_DT, O, DELTA_OUT, EVEN)
    if XT_MODE == 2:    # before the key loop: nothing it needs stays live through the loop for this
        half = tl.zeros([BM], tl.float32)
        if GATED:
            half += g_q
        if NORM:
            half -= lse
            _store_norm_weights(W + (i_b * T * HQ + offs_m * HQ + i_hq) * 8, -delta, mask_m)
        _store_transposed(q, tl.exp(0.5 * half) * sqrt_scale_p, _xt_rows(XT, i_b, i_hq, CB0, NCH, T_FULL, T, HQ, D),
                          T_FULL, offs_m, mask_m, D)
    k_base = K + i_b * T * HK * D + i_hk * D
    v_base = V + i_b * T * HK * D + i_hk * D
    dq = tl.zeros([BM, D], tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)
    lo = 0
    if FAST:
        # off-diagonal key blocks, as in the forward: key factor on the scores, row factor after
        lo = pid_m * BM
        g_r = tl.zeros([1], tl.float32)
        if GATED:
            g_r = tl.load(G + i_b * T * HK + tl.maximum(lo - 1, 0) * HK + i_hk)
        for start_n in range(0, lo, BN):
            offs_n = start_n + tl.arange(0, BN)
            k = tl.load(k_base + offs_n[:, None] * (HK * D) + offs_d[None, :]).to(DOT_DT)
            v = tl.load(v_base + offs_n[:, None] * (HK * D) + offs_d[None, :]).to(DOT_DT)
            c = tl.full([BN], 1.0, tl.float32)
            if GATED:
                g_k = tl.load(G + i_b * T * HK + offs_n * HK + i_hk)
                c = _exp(g_r - g_k, FTZ)
            x = tl.dot(q, tl.trans(k), input_precision=PREC)
            xp1 = _pow(x, P - 1)
            da = tl.dot(do, tl.trans(v), input_precision=PREC)
            if NORM:
                da = da - delta[:, None]
            if SHARED_ROUND:
                g_rb = tl.load(G + i_b * T * HK + (start_n + BN - 1) * HK + i_hk)
                c = _exp(g_rb - g_k, FTZ)
                r_b = tl.full([BM], 1.0, tl.float32) * scale_p          # as the key kernel's r_q
                if NORM:
                    r_b = r_b * tl.exp(-lse)
                r_b = r_b * _exp(g_q - g_rb, FTZ)
                r_b = tl.where(mask_m, r_b, 0.0)
                ds = da * (xp1 * c[None, :] * (P * r_b)[:, None])       # the key kernel's product order
                dq += tl.dot(ds.to(DOT_DT), k, input_precision=PREC)
            elif OFFDIAG_FP32:
                dxp = da * xp1
                if GATED:
                    dxp = dxp * c[None, :]
                dq += tl.dot(dxp, k.to(tl.float32), input_precision=OFFDIAG_PREC)
            else:
                dxp = da * xp1
                if GATED:
                    dxp = dxp * c[None, :]
                dq += tl.dot(dxp.to(DOT_DT), k, input_precision=PREC)
        if not SHARED_ROUND:    # the row factor after the loop (SHARED_ROUND: already in each tile)
            r_q = tl.full([BM], 1.0, tl.float32) * scale_p
            if NORM:
                r_q = r_q * tl.exp(-lse)
            if GATED:
                r_q = r_q * _exp(g_q - g_r, FTZ)
            r_q = tl.where(mask_m, r_q, 0.0)
            dq = dq * (P * r_q)[:, None]
    for start_n in range(lo, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        mask_n = _in_range(offs_n, T, EVEN)
        k = tl.load(k_base + offs_n[:, None] * (HK * D) + offs_d[None, :], mask=mask_n[:, None],
                    other=0.0).to(DOT_DT)
        v = tl.load(v_base + offs_n[:, None] * (HK * D) + offs_d[None, :], mask=mask_n[:, None],
                    other=0.0).to(DOT_DT)
        g_k = tl.zeros([BN], tl.float32)
        if GATED:
            g_k = tl.load(G + i_b * T * HK + offs_n * HK + i_hk, mask=mask_n, other=0.0)
        causal = (offs_m[:, None] >= offs_n[None, :]) & mask_m[:, None] & mask_n[None, :]
        pn, ds = _attn_tile_grads(q, k, v, do, lse, delta, g_q, g_k, causal, scale_p, P, NORM, GATED, PREC, FTZ)
        dq += tl.dot(ds.to(DOT_DT), k, input_precision=PREC)
    tl.store(DQ + q_off, dq.to(DQ.dtype.element_ty), mask=mask_m[:, None])
    if GATED:
        dg = tl.sum(q.to(tl.float32) * dq, axis=1) * (1.0 / P)            # Euler (module docstring)
        tl.store(DGQ + i_b * T * HQ + offs_m * HQ + i_hq, dg, mask=mask_m)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------


def dot_dtype(dtype, norm, backward):
    """Operand dtype of the tensor-core matmuls and their precision. bf16 keeps fp32's exponent range;
    fp16 is used only where the operands are <= 1 (normalized forward); else fp32 (tf32x3)."""
    if dtype == torch.bfloat16:
        return tl.bfloat16, "tf32"
    if dtype == torch.float16 and norm and not backward:
        return tl.float16, "tf32"
    return tl.float32, "tf32x3"


def _fast_paths(kernel, dot_dt, BM, BN):
    """Whether a launch of kernel ("fwd", "dkdv", "dq") takes the off-diagonal fast paths. The query-block kernels
    need whole key blocks per query block (BM % BN == 0); dk/dv also runs with whole query blocks per key block
    (BN % BM == 0). The forward's also needs operands with fp32's range (not fp16)."""
    tiles = BM % BN == 0 or (kernel == "dkdv" and BN % BM == 0)
    return tiles and (kernel != "fwd" or dot_dt != tl.float16)


KERNELS = ("fwd", "dkdv", "dq")


def tile_key(d, kernel, dot_dt, chunked=False, t=None) -> tuple:
    """The tunables table's key of one attention-form kernel's tile ("fwd", "dkdv" or "dq") for head dim d and matmul
    operands dot_dt. chunked: as the chunked form's intra-chunk attention (every chunk a short sequence of its own),
    whose intra_<kernel> rows win where there are some. t: the attention form's sequence length, for its short-sequence
    forward tile (attn_fwd_short up to config.attention's short_fwd_t)."""
    cfg = config.attention.current()
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: expected one of {KERNELS}")
    special = []
    if kernel == "fwd" and not chunked and t is not None and t <= cfg.short_fwd_t:
        special.append("attn_fwd_short")
    if kernel == "dkdv" and cfg.offdiag_fp32_grads:
        special.append("attn_dkdv_offdiag_fp32")
    if chunked and kernel == "fwd":
        special.append("intra_fwd")
    for name in special:
        key = tunables.key(name, d, dot_dt)
        if key is not None and tunables.TABLE[key] is not None:
            return key
    return tunables.key("attn_" + kernel, d, dot_dt)


def blocks(d, kernel, dot_dt, chunked=False, t=None):
    """(BM, BN, num_warps, num_stages[, maxnreg]) of one attention-form kernel: config.attention's block_override
    (the two backward kernels can take different tiles: "dkdv", "dq", or "bwd" for both), else the tunables table's
    row (tile_key)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: expected one of {KERNELS}")
    override = config.attention.current().block_override
    for key in (kernel, "bwd" if kernel != "fwd" else None):
        if key in override:
            return override[key]
    return tunables.TABLE[tile_key(d, kernel, dot_dt, chunked, t)]


def launch_config(d, kernel, dot_dt, prec, chunked=False, t=None):
    """The tile constexprs and launch options (launch_options) of one attention-form kernel (chunked: as the chunked
    form's intra-chunk attention; t: as blocks, and the rows per sequence or chunk for EVEN)."""
    entry = blocks(d, kernel, dot_dt, chunked, t)
    BM, BN = entry[:2]
    return dict(BM=BM, BN=BN, DOT_DT=dot_dt, PREC=prec, FAST=_fast_paths(kernel, dot_dt, BM, BN), FTZ=ptx_exp(),
                EVEN=t is not None and t % BM == 0 and t % BN == 0, **launch_options(entry))


def ptx_exp() -> bool:
    """Whether the kernels' gate exps run as inline PTX (_common._exp's FTZ): on NVIDIA GPUs, not in Triton's CPU
    interpreter (TRITON_INTERPRET=1) or on ROCm, which have none."""
    return os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and torch.version.hip is None


def attention_forward(q, k, v, log_g, scale: float, p: int, norm: bool, record: dict | None = None):
    """The attention form's forward launches: (o, lse, G) with G the gate cumsum (fp32 (b,t,hk); a 1-element dummy
    when ungated) and lse the log row normalizer (fp32 (b,t,hq); a dummy when not norm). q, k, v contiguous.
    record: each compiled kernel goes in with its grid's rows and heads (native/launcher.py's plans)."""
    b, t, hq, d = q.shape
    hk = k.shape[2]
    gated = log_g is not None
    Gc = (gates.segment_scan(log_g, t, record=record) if gated
          else q.new_empty(1, dtype=torch.float32))                             # unread when ungated
    o = torch.empty_like(q)
    f32 = dict(device=q.device, dtype=torch.float32)
    lse = torch.empty(b, t, hq, **f32) if norm else torch.empty(1, **f32)       # unread when not norm
    cfg = launch_config(d, "fwd", *dot_dtype(q.dtype, norm, False), t=t)
    kernel = launch_fwd(q, k, v, Gc, o, lse, scale, scale ** p, t, b * hq, hq, hk, d, p, norm, gated, cfg)
    if record is not None:
        record["fwd"] = (kernel, cfg["BM"], hq)
    return o, lse, Gc


def launch_fwd(q, k, v, G, o, lse, scale, scale_p, t, nbh, hq, hk, d, p, norm, gated, cfg, **side):
    """_attn_fwd with cfg (launch_config) on (b, t, h, d) tensors of nbh / hq sequences (the attention form, or the
    chunked form's chunks as batch entries). side: _attn_fwd's XT_MODE arguments (the chunked form's copy of k).
    Returns the compiled kernel."""
    return _attn_fwd[(-(-t // cfg["BM"]), nbh)](q, k, v, G, o, lse, scale, scale_p, t, HQ=hq, HK=hk, D=d, P=p,
                                                NORM=norm, GATED=gated, **cfg, **side)


def backward_rounding(gated: bool, dot_dt) -> dict:
    """The attention form's backward kernels' rounding constexprs from config.attention: fp32 off-diagonal tiles
    (gated, bf16/fp16 operands) and their matmul precision, else one rounding shared by both kernels (gated). The
    chunked form's intra-chunk attention takes neither."""
    sw = config.attention.current()
    fp32 = sw.offdiag_fp32_grads and gated and dot_dt != tl.float32
    return dict(OFFDIAG_FP32=fp32, OFFDIAG_PREC=sw.offdiag_precision, SHARED_ROUND=gated and not fp32)


EDGE_BM = 64     # rows per program of the one-kernel backward's prep and finish passes (elementwise, memory-bound)


def fused_backward() -> bool:
    """Whether this attention-form backward runs as one kernel with dq by atomics (config.attention's fused_backward;
    never in torch's deterministic mode)."""
    return config.attention.current().fused_backward and not torch.are_deterministic_algorithms_enabled()


@functools.lru_cache(maxsize=None)
def has_tma(device_index: int) -> bool:
    """Whether CUDA device `device_index` has the Tensor Memory Accelerator (sm_90+)."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def tma_dq(device: torch.device) -> bool:
    """Whether the one-kernel backward adds dq by bulk tensor reductions (config.attention's tma_dq) for inputs on
    `device`: on CUDA with TMA (sm_90+; a plan printed where no card is visible assumes sm_90's)."""
    if not (config.attention.current().tma_dq and device.type == "cuda"):
        return False
    return not torch.cuda.is_available() or has_tma(
        device.index if device.index is not None else torch.cuda.current_device())


def with_scratch(launch, device):
    """launch() with Triton's scratch allocator (the tensor descriptors a kernel makes live there) set to torch's on
    `device`, in a copy of the context: the caller's allocator, if any, stays."""
    def scratch(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    def run():
        triton.set_allocator(scratch)
        return launch()
    return contextvars.copy_context().run(run)


def attention_backward(do, q, k, v, Gc, o, lse, scale: float, p: int, norm: bool, gated: bool,
                       record: dict | None = None):
    """The attention form's backward launches: (dq, dk, dv, dlog_g or None). Tensors contiguous, as the forward's.
    record: as attention_forward's."""
    b, t, hq, d = q.shape
    hk = k.shape[2]
    # Delta = dy . y (b,t,hq): formed and stored by the first kernel, the prep pass of the one-kernel backward or the
    # dq kernel of the two (no launch of its own: at short t every launch is host time)
    delta = torch.empty(b, t, hq, device=q.device, dtype=torch.float32) if norm else lse
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dgq = torch.empty(b, t, hq, device=q.device, dtype=torch.float32) if gated else lse
    dgk = torch.empty(b, t, hk, device=q.device, dtype=torch.float32) if gated else lse
    dot_dt, prec = dot_dtype(q.dtype, norm, True)
    kv_cfg, q_cfg = (launch_config(d, kernel, dot_dt, prec, t=t) for kernel in ("dkdv", "dq"))
    common = dict(HQ=hq, HK=hk, D=d, P=p, NORM=norm, GATED=gated, **backward_rounding(gated, dot_dt))
    sp = scale ** p
    atomic, dqa = fused_backward(), None
    if atomic:      # the one-kernel backward: dq by atomics into an fp32 buffer, between a prep and a finish pass
        dqa = torch.empty(b, t, hq, d, device=q.device, dtype=torch.float32)
        rows = (-(-t // EDGE_BM), b * hq)
        first = "prep", _attn_bwd_prep[rows](o, do, delta, dqa, t, HQ=hq, D=d, BM=EDGE_BM, NORM=norm, num_warps=4), \
            EDGE_BM
    else:
        first = "dq", _attn_bwd_dq[(-(-t // q_cfg["BM"]), b * hq)](q, k, v, Gc, do, lse, delta, dq, dgq, scale, sp, t,
                                                                   O=o, DELTA_OUT=norm, **common, **q_cfg), q_cfg["BM"]
    tma = atomic and tma_dq(q.device)

    def launch_dkdv():
        return _attn_bwd_dkdv[(-(-t // kv_cfg["BN"]), b * hk)](q, k, v, Gc, do, lse, delta, dk, dv, dgk, scale, sp, t,
                                                              DQA=dqa, ATOMIC_DQ=atomic, TMA_DQ=tma, **common,
                                                              **kv_cfg)
    kkv = with_scratch(launch_dkdv, q.device) if tma else launch_dkdv()
    if atomic:
        kf = _attn_bwd_dq_finish[rows](q, dqa, dq, dgq, t, HQ=hq, D=d, P=p, BM=EDGE_BM, GATED=gated, DOT_DT=dot_dt,
                                       num_warps=4)
    if record is not None:
        name, kernel, block = first
        record[name], record["dkdv"] = (kernel, block, hq), (kkv, kv_cfg["BN"], hk)
        if atomic:
            record["dq_finish"] = (kf, EDGE_BM, hq)
    dlog_g = gates.segment_scan(dgk, t, reverse=True, extra=dgq, record=record) if gated else None
    return dq, dk, dv, dlog_g
