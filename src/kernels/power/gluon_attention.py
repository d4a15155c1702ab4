"""The attention-form forward (`triton_attention._attn_fwd`, its bf16 fast path) in Gluon (experimental, compiled,
not yet run on a GPU: triton_attention.FWD_GLUON).

Triton's kernel waits on each key block's two matmuls (scores, then weights x values) in turn, so the tensor cores
idle while the weights are formed. Here, within a group of BM / BN key blocks (one query block's width):
- key / value blocks come through a cp.async ring (NBUF slots, refilled NBUF - 2 blocks ahead: with 8 warps both
  warpgroups are past a slot before it is overwritten);
- block j + 1's scores are issued before block j's weights are formed (FA3's intra-warpgroup pipelining), and block
  j's weights x values matmul runs while block j + 1's scores are read;
- the pipe drains once per group (in-flight accumulators across a dynamic loop's back-edge made ptxas serialize every
  wgmma, sessions 14-15).
Same grid, arguments, fast-path semantics and results as `_attn_fwd` (GATE_SCORES: the key gate factor on the scores;
the normalizer sums the weights as rounded for the matmul). Diagonal blocks run unpipelined, masked.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from .gluon_sym2 import _barrier, _cp_async


@gluon.jit
def _pow(s, P: gl.constexpr):
    """s**P for P in 1..4 by multiplication."""
    if P == 1:
        r = s
    elif P == 2:
        r = s * s
    elif P == 3:
        r = s * s * s
    else:
        s2 = s * s
        r = s2 * s2
    return r


@gluon.jit
def _kv_copy(k_ring, v_ring, k_p, v_p, rn, dtrue, j, n_end, T, STEP, BN: gl.constexpr, NBUF: gl.constexpr):
    """cp.async of key / value block j (rows j BN + rn, addresses k_p / v_p of block 0 plus j STEP; rows past T
    zero) into ring slot j % NBUF; nothing past block n_end; one commit group either way, so the waits count
    blocks."""
    if j < n_end:
        off = j * STEP                          # < T HK D: int32 (the batch offset is in k_p, 64-bit)
        m = gl.expand_dims(j * BN + rn < T, 1) & dtrue
        _cp_async(k_ring.index(j % NBUF), k_p + off, mask=m)
        _cp_async(v_ring.index(j % NBUF), v_p + off, mask=m)
    async_copy.commit_group()


@gluon.jit
def _weights(s, g_k, l, P: gl.constexpr, NORM: gl.constexpr, GATED: gl.constexpr, AP: gl.constexpr):
    """Off-diagonal weights of one key block: a = s^P (times the key factor e^(g_r - g_k) with gating), rounded to
    bf16 as the matmul operand (layout AP); l += their row sums (of the rounded weights)."""
    a = _pow(s, P)
    if GATED:
        a = a * gl.expand_dims(g_k, 0)
    ab = a.to(gl.bfloat16)
    if NORM:
        l += gl.sum(ab.to(gl.float32), axis=1)
    return gl.convert_layout(ab, AP), l


@gluon.jit
def gluon_attn_fwd(Q, K, V, G, O, LSE, scale, scale_p, T,
                   HQ: gl.constexpr, HK: gl.constexpr, D: gl.constexpr, P: gl.constexpr, NORM: gl.constexpr,
                   GATED: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr):
    """Program (query block, b*hq), longest rows first: o = sum_j a_ij v_j / sum_j a_ij with a_ij = (s q_i.k_j)^P
    e^(g_i - g_j) over the keys j <= i (NORM; else the plain sum), LSE = log of the normalizer. bf16 q, k, v."""
    gl.static_assert(BM % BN == 0, "whole key blocks per query block")
    gl.static_assert(NBUF >= 4, "refilled NBUF - 2 ahead, at least two blocks landing")
    NW: gl.constexpr = gl.num_warps()
    U: gl.constexpr = BM // BN                       # key blocks per group (the pipe drains once per group)
    MS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BN, 16])
    MO: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, D, 16])
    AQ: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MS, k_width=2)
    AP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MO, k_width=2)
    SROW: gl.constexpr = gl.SliceLayout(1, MS)
    SCOL: gl.constexpr = gl.SliceLayout(0, MS)
    BLK: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [NW, 1], [1, 0])
    KV_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], gl.bfloat16)

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    i_b = (pid_bh // HQ).to(gl.int64)
    i_hq = pid_bh % HQ
    i_hk = i_hq // (HQ // HK)
    dcol = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, BLK)), 0)
    rows_b = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, BLK))
    q_off = gl.expand_dims((i_b * T + rows_b) * HQ + i_hq, 1) * D + dcol
    q = gl.convert_layout(gl.load(Q + q_off, mask=gl.expand_dims(rows_b < T, 1), other=0.0), AQ)
    rows = pid_m * BM + gl.arange(0, BM, layout=SROW)
    mask_m = rows < T
    g_base = G + i_b * T * HK + i_hk
    rn = gl.arange(0, BN, layout=gl.SliceLayout(1, BLK))
    k_p = K + gl.expand_dims((i_b * T + rn) * HK + i_hk, 1) * D + dcol
    v_p = V + gl.expand_dims((i_b * T + rn) * HK + i_hk, 1) * D + dcol
    STEP = BN * HK * D
    dtrue = dcol < D
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], KV_S)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D], KV_S)

    lo = pid_m * BM                                  # keys before the query block: the off-diagonal blocks
    n_off = lo // BN
    n_all = gl.cdiv(gl.minimum(lo + BM, T), BN)
    for p in gl.static_range(NBUF - 2):
        _kv_copy(k_ring, v_ring, k_p, v_p, rn, dtrue, p, n_all, T, STEP, BN, NBUF)
    acc = gl.zeros([BM, D], gl.float32, MO)
    l = gl.zeros([BM], gl.float32, SROW)
    zero_s = gl.zeros([BM, BN], gl.float32, MS)
    g_r = 0.0
    if GATED:
        g_r = gl.load(g_base + gl.maximum(lo - 1, 0) * HK)
    # off-diagonal groups: no masks; a = (q.k)^P e^(g_r - g_k), the row factor s^P e^(g_i - g_r) after the loop
    for grp in range(0, n_off // U):
        j0 = grp * U
        s_next = zero_s
        a_prev = gl.zeros([BM, BN], gl.bfloat16, AP)
        for u in gl.static_range(U):
            j = j0 + u
            async_copy.wait_group(NBUF - 4)     # this thread's copies of block j + 1 landed (j's one step earlier)
            _barrier()                          # everyone's; every warpgroup is past block j - 2's matmuls
            _kv_copy(k_ring, v_ring, k_p, v_p, rn, dtrue, j + NBUF - 2, n_all, T, STEP, BN, NBUF)
            if u == 0:
                s_cur = warpgroup_mma(q, k_ring.index(j % NBUF).permute((1, 0)), zero_s, use_acc=False)
            else:
                s_cur = s_next
            if u + 1 < U:                       # block j + 1's scores while block j's weights are formed
                s_next = warpgroup_mma(q, k_ring.index((j + 1) % NBUF).permute((1, 0)), zero_s, use_acc=False,
                                       is_async=True)
            g_k = gl.full([BN], 1.0, gl.float32, SCOL)
            if GATED:
                g_k = gl.exp(g_r - gl.load(g_base + (j * BN + gl.arange(0, BN, layout=SCOL)) * HK))
            a, l = _weights(s_cur, g_k, l, P, NORM, GATED, AP)
            acc = warpgroup_mma(a, v_ring.index(j % NBUF), acc, is_async=True)
            if u + 1 < U:
                s_next, acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(s_next, acc, a_prev))
                a_prev = a
            else:
                acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
    row_f = gl.full([BM], 1.0, gl.float32, SROW) * scale_p
    if GATED:
        row_f = row_f * gl.exp(gl.load(g_base + rows * HK, mask=mask_m, other=0.0) - g_r)
    row_f = gl.where(mask_m, row_f, 0.0)                 # padded rows: exp(-g_r) may be inf
    acc = acc * gl.expand_dims(gl.convert_layout(row_f, gl.SliceLayout(1, MO)), 1)
    l = l * row_f
    # diagonal blocks: causal mask, the full gate difference and the scale per element
    g_q = gl.zeros([BM], gl.float32, SROW)
    if GATED:
        g_q = gl.load(g_base + rows * HK, mask=mask_m, other=0.0)
    for j in range(n_off, n_all):
        async_copy.wait_group(NBUF - 3)
        _barrier()
        _kv_copy(k_ring, v_ring, k_p, v_p, rn, dtrue, j + NBUF - 2, n_all, T, STEP, BN, NBUF)
        s = warpgroup_mma(q, k_ring.index(j % NBUF).permute((1, 0)), zero_s, use_acc=False) * scale
        cols = j * BN + gl.arange(0, BN, layout=SCOL)
        causal = (gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)) & gl.expand_dims(cols < T, 0)
        if GATED:
            g_k = gl.load(g_base + cols * HK, mask=cols < T, other=0.0)
            a = _pow(s, P) * gl.exp(gl.where(causal, gl.expand_dims(g_q, 1) - gl.expand_dims(g_k, 0),
                                             float("-inf")))
        else:
            a = gl.where(causal, _pow(s, P), 0.0)
        ab = a.to(gl.bfloat16)
        if NORM:
            l += gl.sum(ab.to(gl.float32), axis=1)
        acc = warpgroup_mma(gl.convert_layout(ab, AP), v_ring.index(j % NBUF), acc)
    async_copy.wait_group(0)

    o = gl.convert_layout(acc, BLK)
    if NORM:
        l = gl.maximum(l, 1e-30)                         # all-zero row -> y = 0
        o = o / gl.expand_dims(gl.convert_layout(l, gl.SliceLayout(1, BLK)), 1)
        gl.store(LSE + (i_b * T + rows) * HQ + i_hq, gl.log(l), mask=mask_m)
    gl.store(O + q_off, o.to(O.dtype.element_ty), mask=gl.expand_dims(rows_b < T, 1))
