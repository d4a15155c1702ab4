"""Chunked form of power attention in Triton (forward + backward), with the tiled symmetric-power expansion done
on the fly inside the matmuls ("expand-MMA": phi(K) / phi(Q) never exist in HBM).

Math (reference.py `_block`, docs/kernels.md). Chunk n covers tokens [nC, nC + C); g = chunk-local
cumulative log-gate (g_i = sum of log_g from the chunk start to i), gt_n = g at the chunk's last token, s = scale:

    intra_i  = attention form on the chunk alone (reuses parallel._attn_fwd: y_intra, lse_intra)
    U_n      = sum_{j in n} w phi(k_j) e^(gt_n - g_j) v_j^T,  Uz_n = same with v_j -> 1   (update-state, expand-M)
    S_{n+1}  = e^(gt_n) S_n + U_n   (discumsum; S_0 = initial state)
               _update_state_fwd computes every chunk's U_n in parallel (grid over chunk x state tile x value
               block x b*hk) into slot n+1 of the state buffer, then _discumsum (elementwise, one program per
               block of the flattened state, walking the chunks) turns the slots into the states entering each
               chunk, in place.
    inter_i  = r_i phi(q_i) S_n, den_i = r_i phi(q_i) . z_n,  r_i = s^p e^(g_i)       (query-state, expand-K)
    y_i      = (N_i + inter_i) / (L_i + den_i)  (norm; stabilized by max(lse_intra, log den)) or N_i + inter_i

phi is the tiled symmetric power of reference.py (`state_tile`, `_ndmi`): block l of the state holds the
F = TILE^p features prod_z x[IDX[l, z] * TILE + sub_z(f)]; the multiplicity w_l goes on the key side only.
Gates fold into per-row factors (phi is homogeneous): keys get e^(gt_n - g_j) <= 1, queries e^(g_i) <= 1.

Backward (Den_i = total normalizer, Delta_i = dy_i . y_i, dn_i = dy_i / Den_i, dl_i = -Delta_i / Den_i):
  * intra: the attention-form backward kernels with lse = log Den_i (the combined normalizer);
  * query side (_query_state_bwd): X = r_i (S_n dn_i + z_n dl_i) = dL/dphi(q_i); dq += contract(X),
    dg_i += X . phi(q_i);
  * states: R_n = dL/dS_n = Q_n + e^(gt_n) R_{n+1}, Q_n = sum_{i in n} r_i phi(q_i)^T [dn_i | dl_i],
    R_NC = gradient of the returned state; dU_n = R_{n+1}, dgt_n = e^(gt_n) <S_n, R_{n+1}>, dS_0 = R_0.
    _query_grad_state computes every Q_n in parallel, _discumsum(REVERSE) accumulates in place (and the
    per-block dgt partials);
  * key side (_update_state_bwd): X = dU_n v_j + dUz_n = dL/d(w phi(k_j) e^(gt_n - g_j)); dv += ph dU,
    dk += contract(X), Y_j = X . ph_j: dg_j -= Y_j, dgt_n += Y_j.
contract(X) maps a feature gradient back to the d inputs: dx[col_z(f)] += X_f prod_{z' != z} x[col_z'(f)],
done as a matmul with a one-hot [F, d] matrix per factor z.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import config
from . import parallel as attn
from ._common import _combine_store, _has_state, _key_block, _key_rows, _kv_heads, _query_block, _row_factor
from .chunk_p2 import config as p2_config
from .chunk_p2 import kernels as sym2
from .parallel import _attn_bwd_dkdv, _attn_bwd_dq, _dot_dtype, _launch_cfg
from .reference import _ndmi, state_dim, state_tile


# ----------------------------------------------------------------------------------------------
# expansion helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _state_tile(l, pid_v, F: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """State block l x value block pid_v of a state kernel: the block's feature and value offsets, whether it
    writes the normalizer state (value block 0 only) and its [F, BD] offsets within one D_s x D state."""
    offs_f = tl.arange(0, F)
    offs_v = pid_v * BD + tl.arange(0, BD)
    z_store = (offs_f + pid_v * F) < F
    return offs_f, offs_v, z_store, (l * F + offs_f)[:, None] * D + offs_v[None, :]


@triton.jit
def _factor(X_rows, mask, IDX, l, z: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr, F: tl.constexpr):
    """Factor z of expansion block l: x[:, IDX[l, z] * TILE + sub_z(f)] as [B, F] fp32, and its columns [F]."""
    offs_f = tl.arange(0, F)
    if P - 1 - z == 0:
        sub = offs_f % TILE
    elif P - 1 - z == 1:
        sub = (offs_f // TILE) % TILE
    elif P - 1 - z == 2:
        sub = (offs_f // (TILE * TILE)) % TILE
    else:
        sub = offs_f // (TILE * TILE * TILE)
    col = tl.load(IDX + l * P + z) * TILE + sub                           # [F]
    x = tl.load(X_rows + col[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    return x, col


@triton.jit
def _expand(X_rows, mask, IDX, l, P: tl.constexpr, TILE: tl.constexpr, F: tl.constexpr):
    """Block l of phi(x) for B rows: X_rows [B, 1] pointers to the rows. Returns (phi [B, F], factors, columns);
    unused factors (z >= P) are 1 and their columns 0."""
    f0, c0 = _factor(X_rows, mask, IDX, l, 0, P, TILE, F)
    f1 = tl.full(f0.shape, 1.0, tl.float32)
    f2 = f1
    f3 = f1
    c1 = c0 * 0
    c2 = c1
    c3 = c1
    phi = f0
    if P >= 2:
        f1, c1 = _factor(X_rows, mask, IDX, l, 1, P, TILE, F)
        phi = phi * f1
    if P >= 3:
        f2, c2 = _factor(X_rows, mask, IDX, l, 2, P, TILE, F)
        phi = phi * f2
    if P >= 4:
        f3, c3 = _factor(X_rows, mask, IDX, l, 3, P, TILE, F)
        phi = phi * f3
    return phi, f0, f1, f2, f3, c0, c1, c2, c3


@triton.jit
def _onehot_dot(x, col, D: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """x [B, F] @ E [F, D] with E[f, col[f]] = 1: scatter-add of feature gradients into the d columns."""
    e = (col[:, None] == tl.arange(0, D)[None, :]).to(DOT_DT)
    return tl.dot(x.to(DOT_DT), e, input_precision=PREC)


@triton.jit
def _contract(X, f0, f1, f2, f3, c0, c1, c2, c3, P: tl.constexpr, D: tl.constexpr, DOT_DT: tl.constexpr,
              PREC: tl.constexpr):
    """dx [B, D] of sum_f X_f prod_z x[col_z(f)]: sum over z of (X prod_{z' != z} f_z') one-hot-scattered."""
    if P == 1:
        dx = _onehot_dot(X, c0, D, DOT_DT, PREC)
    elif P == 2:
        dx = _onehot_dot(X * f1, c0, D, DOT_DT, PREC) + _onehot_dot(X * f0, c1, D, DOT_DT, PREC)
    elif P == 3:
        dx = (_onehot_dot(X * (f1 * f2), c0, D, DOT_DT, PREC) + _onehot_dot(X * (f0 * f2), c1, D, DOT_DT, PREC)
              + _onehot_dot(X * (f0 * f1), c2, D, DOT_DT, PREC))
    else:
        f01 = f0 * f1
        f23 = f2 * f3
        dx = (_onehot_dot(X * (f1 * f23), c0, D, DOT_DT, PREC) + _onehot_dot(X * (f0 * f23), c1, D, DOT_DT, PREC)
              + _onehot_dot(X * (f01 * f3), c2, D, DOT_DT, PREC) + _onehot_dot(X * (f01 * f2), c3, D, DOT_DT, PREC))
    return dx


@triton.jit
def _chunk_update(K, V, G, IDX, w, l, n, i_b, i_hk, offs_v, T, HK: tl.constexpr, D: tl.constexpr,
                  P: tl.constexpr, TILE: tl.constexpr, F: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                  GATED: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """(U_n, Uz_n) of state block l, value columns offs_v: sum over chunk n's keys j of
    (w phi(k_j) e^(gt_n - g_j)) v_j^T ([F, BD]) and of w phi(k_j) e^(gt_n - g_j) ([F]), fp32."""
    offs_c = tl.arange(0, BK)
    start = n * C
    if GATED:
        g_end = tl.load(G + (i_b * T + start + C - 1) * HK + i_hk)
    u = tl.zeros([F, offs_v.shape[0]], tl.float32)
    uz = tl.zeros([F], tl.float32)
    for j0 in range(0, C, BK):
        rows = start + j0 + offs_c                                       # [BK]
        mask = ((j0 + offs_c) < C) & (rows < T)
        k_rows = K + ((i_b * T + rows) * HK + i_hk) * D
        phi, f0, f1, f2, f3, c0, c1, c2, c3 = _expand(k_rows[:, None], mask, IDX, l, P, TILE, F)
        cw = tl.where(mask, w, 0.0)
        if GATED:
            g = tl.load(G + (i_b * T + rows) * HK + i_hk, mask=mask, other=0.0)
            cw = cw * tl.exp(g_end - g)
        phi = phi * cw[:, None]                                          # [BK, F] gated, weighted phi(k)
        vv = tl.load(V + ((i_b * T + rows) * HK + i_hk)[:, None] * D + offs_v[None, :],
                     mask=mask[:, None], other=0.0)                      # [BK, BD]
        u += tl.dot(tl.trans(phi.to(DOT_DT)), vv.to(DOT_DT), input_precision=PREC)
        uz += tl.sum(phi, axis=0)
    return u, uz


@triton.jit
def _chunk_query_grad(Q, G, IDX, DO, LSE, DELTA, scale_p, l, n, i_b, i_hk, offs_v, T, HQ: tl.constexpr,
                      HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr, F: tl.constexpr,
                      C: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                      DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """(Q_n, Qz_n) of state block l, value columns offs_v: the direct gradient of S_n from chunk n's queries,
    sum over the GQA group's heads and chunk n's rows i of r_i phi(q_i)^T dn_i ([F, BD]) and r_i phi(q_i) dl_i."""
    REP: tl.constexpr = HQ // HK
    offs_c = tl.arange(0, BM)
    du = tl.zeros([F, offs_v.shape[0]], tl.float32)
    duz = tl.zeros([F], tl.float32)
    for rep in range(REP):
        i_hq = i_hk * REP + rep
        for j0 in range(0, C, BM):
            rows = n * C + j0 + offs_c
            mask = ((j0 + offs_c) < C) & (rows < T)
            row = (i_b * T + rows) * HQ + i_hq
            phi, f0, f1, f2, f3, c0, c1, c2, c3 = _expand((Q + row * D)[:, None], mask, IDX, l, P, TILE, F)
            wr = _row_factor(G, scale_p, i_b, T, rows, mask, i_hk, HK, BM, GATED)
            if NORM:
                inv = tl.exp(-tl.load(LSE + row, mask=mask, other=0.0))
                wr = wr * inv
                dl = -tl.load(DELTA + row, mask=mask, other=0.0) * wr
                duz += tl.sum(phi * dl[:, None], axis=0)
            do = tl.load(DO + row[:, None] * D + offs_v[None, :], mask=mask[:, None], other=0.0)
            du += tl.dot(tl.trans((phi * wr[:, None]).to(DOT_DT)), do.to(DOT_DT), input_precision=PREC)
    return du, duz


# ----------------------------------------------------------------------------------------------
# forward kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _query_state_fwd(Q, G, IDX, S, Z, OI, LSEI, Y, LSE, scale_p, T, NC, DS, L,
                     HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr,
                     F: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr,
                     GATED: tl.constexpr, HAS_S0: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """Query-state fused with the combine. Program (query block of a chunk, chunk n, b*hq):
    inter = r phi(q) S_n, den = r phi(q) z_n; y = (y_intra e^lse + inter) / (e^lse + den) stabilized
    (norm) or y_intra + inter; stores y and lse = log(total normalizer) for the backward."""
    i_b, i_hq, i_hk, n, rows, mask = _query_block(T, HQ, HK, C, BM)
    offs_f = tl.arange(0, F)
    offs_d = tl.arange(0, D)
    q_rows = Q + ((i_b * T + rows) * HQ + i_hq) * D                     # [BM]
    s_base = ((i_b * HK + i_hk) * (NC + 1) + n) * DS
    num = tl.zeros([BM, D], tl.float32)
    den = tl.zeros([BM], tl.float32)
    for l in range(L * _has_state(n, HAS_S0)):
        phi, f0, f1, f2, f3, c0, c1, c2, c3 = _expand(q_rows[:, None], mask, IDX, l, P, TILE, F)
        s_blk = tl.load(S + (s_base + l * F + offs_f)[:, None] * D + offs_d[None, :])   # [F, D]
        num += tl.dot(phi.to(DOT_DT), s_blk.to(DOT_DT), input_precision=PREC)
        if NORM:
            z_blk = tl.load(Z + s_base + l * F + offs_f)                 # [F]
            den += tl.sum(phi * z_blk[None, :], axis=1)
    r = _row_factor(G, scale_p, i_b, T, rows, mask, i_hk, HK, BM, GATED)
    _combine_store(num, den, r, OI, LSEI, Y, LSE, (i_b * T + rows) * HQ + i_hq, mask, NORM, D)


# ----------------------------------------------------------------------------------------------
# backward kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _query_state_bwd(Q, G, IDX, S, Z, DO, LSE, DELTA, DQ, DGQ, scale_p, T, NC, DS, L,
                     HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr,
                     F: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, NORM: tl.constexpr,
                     GATED: tl.constexpr, HAS_S0: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """Query side of the state term: DQ (fp32) += contract(X), DGQ = X . phi(q), X = r (S dn + z dl)."""
    i_b, i_hq, i_hk, n, rows, mask = _query_block(T, HQ, HK, C, BM)
    offs_f = tl.arange(0, F)
    offs_d = tl.arange(0, D)
    row = (i_b * T + rows) * HQ + i_hq                                   # [BM]
    q_rows = Q + row * D
    o_off = row[:, None] * D + offs_d[None, :]
    dn = tl.load(DO + o_off, mask=mask[:, None], other=0.0).to(tl.float32)   # [BM, D]
    r = _row_factor(G, scale_p, i_b, T, rows, mask, i_hk, HK, BM, GATED)
    if NORM:
        inv = tl.exp(-tl.load(LSE + row, mask=mask, other=0.0))
        dn = dn * inv[:, None]
        dl = -tl.load(DELTA + row, mask=mask, other=0.0) * inv
    s_base = ((i_b * HK + i_hk) * (NC + 1) + n) * DS
    dq = tl.zeros([BM, D], tl.float32)
    dg = tl.zeros([BM], tl.float32)
    for l in range(L * _has_state(n, HAS_S0)):
        phi, f0, f1, f2, f3, c0, c1, c2, c3 = _expand(q_rows[:, None], mask, IDX, l, P, TILE, F)
        s_blk = tl.load(S + (s_base + l * F + offs_f)[:, None] * D + offs_d[None, :])   # [F, D]
        x = tl.dot(dn.to(DOT_DT), tl.trans(s_blk.to(DOT_DT)), input_precision=PREC)     # [BM, F]
        if NORM:
            z_blk = tl.load(Z + s_base + l * F + offs_f)
            x += dl[:, None] * z_blk[None, :]
        x = x * r[:, None]
        dg += tl.sum(x * phi, axis=1)
        dq += _contract(x, f0, f1, f2, f3, c0, c1, c2, c3, P, D, DOT_DT, PREC)
    dq += tl.load(DQ + o_off, mask=mask[:, None], other=0.0)
    tl.store(DQ + o_off, dq, mask=mask[:, None])
    if GATED:
        tl.store(DGQ + row, dg, mask=mask)


@triton.jit
def _update_state_bwd(K, V, G, IDX, MULT, DU, DUZ, DK, DV, DGK, T, NC, DS, L, NU,
                      HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr, F: tl.constexpr,
                      C: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr,
                      DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """Key side of the state term. Program (key block of a chunk, chunk n, b*hk): with ph = w phi(k) c_j,
    c_j = e^(gt_n - g_j) and X = v dU_n^T + dUz_n: DV += ph dU_n, DK += contract(X w c_j), DGK = -X . ph.
    dU_n is slot n of DU / DUZ, NU = NC+1 slots per (b, hk): the caller passes its dL/dS buffer offset by one
    slot, dU_n = dL/dS_{n+1}."""
    i_b, i_hk, n, pid_bh, rows, mask = _key_block(T, HK, C, BK)
    offs_f = tl.arange(0, F)
    offs_d = tl.arange(0, D)
    row, kv_off, v, c = _key_rows(V, G, T, i_b, i_hk, n, rows, mask, HK, D, C, GATED)   # v [BK, D]
    u_base = (pid_bh.to(tl.int64) * NU + n) * DS
    dk = tl.zeros([BK, D], tl.float32)
    dv = tl.zeros([BK, D], tl.float32)
    y = tl.zeros([BK], tl.float32)
    for l in range(L):
        phi, f0, f1, f2, f3, c0, c1, c2, c3 = _expand((K + row * D)[:, None], mask, IDX, l, P, TILE, F)
        cw = c * tl.load(MULT + l)
        ph = phi * cw[:, None]                                           # [BK, F]
        du = tl.load(DU + (u_base + l * F + offs_f)[:, None] * D + offs_d[None, :])   # [F, D]
        duz = tl.load(DUZ + u_base + l * F + offs_f)
        x = tl.dot(v.to(DOT_DT), tl.trans(du.to(DOT_DT)), input_precision=PREC) + duz[None, :]   # [BK, F]
        dv += tl.dot(ph.to(DOT_DT), du.to(DOT_DT), input_precision=PREC)
        y += tl.sum(x * ph, axis=1)
        dk += _contract(x * cw[:, None], f0, f1, f2, f3, c0, c1, c2, c3, P, D, DOT_DT, PREC)
    dk += tl.load(DK + kv_off, mask=mask[:, None], other=0.0)
    dv += tl.load(DV + kv_off, mask=mask[:, None], other=0.0)
    tl.store(DK + kv_off, dk, mask=mask[:, None])
    tl.store(DV + kv_off, dv, mask=mask[:, None])
    if GATED:
        tl.store(DGK + row, -y, mask=mask)


# ----------------------------------------------------------------------------------------------
# parallel state path (default): update-state per chunk in parallel, then a light discumsum
# ----------------------------------------------------------------------------------------------
@triton.jit
def _update_state_fwd(K, V, G, IDX, MULT, S, Z, T, NC, DS, L,
                      HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr, F: tl.constexpr,
                      C: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, GATED: tl.constexpr,
                      DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """Update-state of one chunk, all chunks in parallel. Program (chunk n * L + state block l, value block,
    b*hk): U_n[l-block, v-block] = sum_j (w phi(k_j) e^(gt_n - g_j)) v_j^T ([F, BD], expand-MMA, fp32
    accumulate) and Uz_n[l-block]; written to slot n+1 of S (b, hk, NC+1, DS, D) / Z (b, hk, NC+1, DS), which
    _discumsum then turns into the states S_{n+1} in place."""
    n = tl.program_id(0) // L
    l = tl.program_id(0) % L
    pid_v = tl.program_id(1)
    pid_bh = tl.program_id(2)
    i_b, i_hk = _kv_heads(pid_bh, HK)
    offs_f, offs_v, z_store, st_off = _state_tile(l, pid_v, F, BD, D)
    w = tl.load(MULT + l)
    u, uz = _chunk_update(K, V, G, IDX, w, l, n, i_b, i_hk, offs_v, T, HK, D, P, TILE, F, C, BK, GATED, DOT_DT,
                          PREC)
    s_base = (pid_bh.to(tl.int64) * (NC + 1) + n + 1) * DS
    tl.store(S + s_base * D + st_off, u)
    tl.store(Z + s_base + l * F + offs_f, uz, mask=z_store)


@triton.jit
def _query_grad_state(Q, G, IDX, DO, LSE, DELTA, DR, DRZ, scale_p, T, NC, DS, L,
                      HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, P: tl.constexpr, TILE: tl.constexpr,
                      F: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                      NORM: tl.constexpr, GATED: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr):
    """Mirror of _update_state_fwd for the backward, all chunks in parallel. Program (chunk n * L + l, value
    block, b*hk): the direct gradient of S_n from chunk n's queries (all query heads of the GQA group),
    Q_n = sum_i r_i phi(q_i)^T dn_i ([F, BD]) and Qz_n = sum_i r_i phi(q_i) dl_i, written to slot n of
    DR (b, hk, NC+1, DS, D) / DRZ; the reverse _discumsum accumulates them into dL/dS_n."""
    n = tl.program_id(0) // L
    l = tl.program_id(0) % L
    pid_v = tl.program_id(1)
    pid_bh = tl.program_id(2)
    i_b, i_hk = _kv_heads(pid_bh, HK)
    offs_f, offs_v, z_store, st_off = _state_tile(l, pid_v, F, BD, D)
    du, duz = _chunk_query_grad(Q, G, IDX, DO, LSE, DELTA, scale_p, l, n, i_b, i_hk, offs_v, T, HQ, HK, D, P, TILE,
                                F, C, BM, NORM, GATED, DOT_DT, PREC)
    s_base = (pid_bh.to(tl.int64) * (NC + 1) + n) * DS
    tl.store(DR + s_base * D + st_off, du)
    tl.store(DRZ + s_base + l * F + offs_f, duz, mask=z_store)


@triton.jit
def _discumsum(X, G, S, DGT, M, T, NC, HK: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr,
               GATED: tl.constexpr, REVERSE: tl.constexpr):
    """Gated cumulative sum over chunks, in place, elementwise, fp32 arithmetic. X: (b*hk, NC+1, M) fp32 or
    bf16 (the p=2 bf16 path stores states in bf16; the running sum stays fp32 in registers). Program (block of M,
    b*hk), decay_n = e^(gt_n):
      forward (REVERSE=False): slot 0 holds S_0, slot n+1 holds U_n  ->  slot n+1 = S_{n+1} = decay_n S_n + U_n;
      reverse (REVERSE=True): slot NC holds dL/dS_NC, slot n < NC holds the direct gradient Q_n of S_n
        -> slot n = R_n = Q_n + decay_n R_{n+1} = dL/dS_n; if GATED also DGT[b*hk, block, n] =
        decay_n <S_n, R_{n+1}> over this block (S: the forward states, same layout as X)."""
    pid = tl.program_id(0)
    pid_bh = tl.program_id(1)
    nblk = tl.num_programs(0)
    i_b, i_hk = _kv_heads(pid_bh, HK)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    bh = pid_bh.to(tl.int64) * (NC + 1)                                 # slot index of (b*hk, 0); int64 offsets
    if REVERSE:
        acc = tl.load(X + (bh + NC) * M + offs, mask=mask, other=0.0).to(tl.float32)
        for n_rev in range(NC):
            n = NC - 1 - n_rev
            x = tl.load(X + (bh + n) * M + offs, mask=mask, other=0.0).to(tl.float32)
            if GATED:
                decay = tl.exp(tl.load(G + (i_b * T + n * C + C - 1) * HK + i_hk))
                s_n = tl.load(S + (bh + n) * M + offs, mask=mask, other=0.0).to(tl.float32)
                tl.store(DGT + (pid_bh.to(tl.int64) * nblk + pid) * NC + n, decay * tl.sum(s_n * acc, axis=0))
                acc = x + decay * acc
            else:
                acc = x + acc
            tl.store(X + (bh + n) * M + offs, acc, mask=mask)
    else:
        acc = tl.load(X + bh * M + offs, mask=mask, other=0.0).to(tl.float32)
        for n in range(NC):
            x = tl.load(X + (bh + n + 1) * M + offs, mask=mask, other=0.0).to(tl.float32)
            if GATED:
                decay = tl.exp(tl.load(G + (i_b * T + n * C + C - 1) * HK + i_hk))
                acc = decay * acc + x
            else:
                acc = acc + x
            tl.store(X + (bh + n + 1) * M + offs, acc, mask=mask)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------
_TABLES: dict = {}


def _tables(p, d, device):
    """(IDX (L, p) int32, MULT (L,) fp32, TILE, F, L) of the tiled symmetric power (reference.py's layout);
    cached per (p, d, device), so a call makes no host-to-device copy."""
    key = (p, d, str(device))
    if key not in _TABLES:
        tile = state_tile(p, d)
        idx, mult = _ndmi(d // tile, p)
        _TABLES[key] = (torch.tensor(idx, dtype=torch.int32, device=device).contiguous(),
                        torch.tensor(mult, dtype=torch.float32, device=device), tile, tile ** p, len(idx))
    return _TABLES[key]





def _chunk_batches(nb, heads):
    """Slices of the b*NC chunk-batch such that one intra-chunk launch has <= max_grid_y programs in grid dim 1."""
    step = max(1, config.chunk.current().max_grid_y // heads)
    return [slice(i, min(i + step, nb)) for i in range(0, nb, step)]


def _chunk_view(x, nb, C, real=True):
    """(b, NC*C, ...) -> (b*NC, C, ...): each chunk one batch entry. Placeholders (real=False) pass through."""
    return x.view(nb, C, *x.shape[2:]) if real else x


def _state_operands(dtype):
    """Operand dtype and precision of the state matmuls: bf16 for bf16 inputs (fp32 accumulation), else fp32
    operands as tf32x3 (fp16: phi of large-norm inputs can exceed 65504)."""
    return (tl.bfloat16, "tf32") if dtype == torch.bfloat16 else (tl.float32, "tf32x3")


def _chunk_blocks(F, d, dot_dt):
    """(rows per step BK/BM, value columns per state program BD, warps, stages). Not timed on a GPU; chosen so that
    sm_90 compiles (tools/compile_check.py) fit in shared memory and spill little: 8 warps, [B, F] expanded tiles
    of 4k elements (2k for fp32 operands with F = 256)."""
    if F <= 64:
        return (32 if dot_dt == tl.float32 and d == 128 else 64), min(d, 64), 8, 2
    if dot_dt == tl.float32:
        return 16, 16, 8, 2
    return 32, 32, 8, 2


def _copy_in_attention(fast, x, d, C, keys) -> bool:
    """Whether the attention kernels write the Gluon outer product's scaled copy of x, the keys or the queries
    (chunk_p2 config xt_in_attention; the p=2 path with gluon_outer)."""
    return fast and bool(p2_config.current().xt_in_attention & (1 if keys else 2)) and sym2.gluon_outer_applies(x, d, C)


def chunked_forward(q, k, v, gl, s0, z0, scale: float, p: int, norm: bool, C: int):
    """The chunked form's forward launches: (y, S, Z, lse, G) with S / Z the states entering each chunk and the
    final one (b, hk, NC+1, D_s, d) / (b, hk, NC+1, D_s), G the contiguous gl or a dummy. Arguments as
    autograd.ChunkedForm's; q, k, v contiguous."""
    b, T, hq, d = q.shape
    hk = k.shape[2]
    NC = T // C
    dev = q.device
    gated = gl is not None
    f32 = dict(device=dev, dtype=torch.float32)
    dummy = torch.zeros(1, **f32)
    G = gl.contiguous() if gated else dummy
    IDX, MULT, TILE, F, L = _tables(p, d, dev)
    DS = state_dim(p, d)
    sp = scale ** p
    block = config.chunk.current().discumsum_block     # elements of the flattened state per _discumsum program
    # intra-chunk attention: each chunk is one batch entry of the attention-form kernel
    attn_cfg = _launch_cfg(d, "fwd", *_dot_dtype(q.dtype, norm, False), chunked=True)
    fast = sym2.applies(p, d, q.dtype)      # p = 2: the state kernels of chunk_p2/
    p2 = p2_config.current()
    # bf16 inputs on the p=2 path: the intra output and the per-chunk states are stored in bf16 (they are
    # bf16 matmul operands anyway; sums stay fp32 in registers): half the memory of fp32 buffers
    low = fast and q.dtype == torch.bfloat16
    o_intra = torch.empty(b, T, hq, d, device=dev, dtype=torch.bfloat16 if low else torch.float32)
    lse_intra = torch.empty(b, T, hq, **f32) if norm else dummy
    nb = b * NC
    cq, ck, cv, cG, co = (_chunk_view(x, nb, C, r) for x, r in
                          ((q, True), (k, True), (v, True), (G, gated), (o_intra, True)))
    cl = _chunk_view(lse_intra, nb, C, norm)
    # the Gluon outer products' scaled copy of k, written by the attention kernel (it holds those rows anyway)
    copy_k = sym2.scaled_copy_buffers(k, T, hk, d, norm, True) if _copy_in_attention(fast, k, d, C, True) else None
    for sl in _chunk_batches(nb, hq):
        side = dict(XT=copy_k[0], CB0=sl.start, NCH=NC, T_FULL=T, XT_MODE=1) if copy_k else {}
        attn.launch_fwd(cq[sl], ck[sl], cv[sl], cG[sl] if gated else G, co[sl], cl[sl] if norm else cl,
                                    scale, sp, C, (sl.stop - sl.start) * hq, hq, hk, d, p, norm, gated, attn_cfg,
                                    **side)
    # states entering each chunk (+ the final one)
    sdt, sprec = _state_operands(q.dtype)
    rows, BD, warps, stages = _chunk_blocks(F, d, sdt)
    S = torch.empty(b, hk, NC + 1, DS, d, device=dev, dtype=torch.bfloat16 if low else torch.float32)
    Z = torch.empty(b, hk, NC + 1, DS, **f32)
    has_s0 = s0 is not None
    # 1. U_n of every chunk in parallel -> slots 1..NC; 2. slot 0 = S_0; 3. discumsum in place
    if has_s0:
        S[:, :, 0] = s0
        Z[:, :, 0] = z0
    else:
        S[:, :, 0].zero_()
        Z[:, :, 0].zero_()
    scanned = False
    if fast:
        scanned, _ = sym2.launch_outer(k, v, G, dummy, dummy, S, Z, sp, T, NC, DS, 1, hk, hk, d, C, True, norm,
                                       gated, sdt, sprec, scan=True, copy=copy_k)
        del copy_k
    else:
        _update_state_fwd[(NC * L, d // BD, b * hk)](
            k, v, G, IDX, MULT, S, Z, T, NC, DS, L, HK=hk, D=d, P=p, TILE=TILE, F=F, C=C, BK=rows,
            BD=BD, GATED=gated, DOT_DT=sdt, PREC=sprec, num_warps=warps, num_stages=stages)
    for X, M in ((S, DS * d), (Z, DS)) if not scanned else ():
        _discumsum[(triton.cdiv(M, block), b * hk)](
            X, G, dummy, dummy, M, T, NC, HK=hk, C=C, BLOCK=block, GATED=gated, REVERSE=False,
            num_warps=4)
    y = torch.empty_like(q)
    lse = torch.empty(b, T, hq, **f32) if norm else dummy
    if fast and sym2.gluon_rows_applies("qfwd", q, d):
        from .chunk_p2.gluon_rows import gluon_query_fwd_rows
        bm, warps, nbuf = p2.qfwd_block
        gluon_query_fwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
            q, G, S, Z, o_intra, lse_intra, y, lse, sp, T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE,
            MINW=sym2.gluon_window_min(d, "qfwd"), BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, NBUF=nbuf,
            num_warps=warps, **sym2.gluon_rows_regs("qfwd"))
    elif fast:
        _, bm, _, _ = sym2.blocks("qfwd_rows", d)
        sym2._sym2_query_fwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
            q, G, S, Z, o_intra, lse_intra, y, lse, sp, T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE,
            KW2=sym2.half_window(d), BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
            PIPE=p2.qfwd_pipe, **sym2.launch_options("qfwd_rows", d))
    else:
        _query_state_fwd[(triton.cdiv(C, rows), NC, b * hq)](
            q, G, IDX, S, Z, o_intra, lse_intra, y, lse, sp, T, NC, DS, L, HQ=hq, HK=hk, D=d, P=p, TILE=TILE,
            F=F, C=C, BM=rows, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
            num_warps=warps, num_stages=stages)
    return y, S, Z, lse, G


def chunked_backward(dy, dsf, dzf, q, k, v, G, S, Z, y, lse, scale: float, p: int, norm: bool, gated: bool, C: int,
                     has_s0: bool, states_in_place: bool = False):
    """The chunked form's backward launches: (dq, dk, dv, dgl, ds0, dz0) from the forward's tensors
    (chunked_forward) and the gradients of y and of the final state (dsf, dzf: fp32, or None where unused: zeros).
    states_in_place: the state gradients dL/dS_n may be written over the forward's states S (the caller will not
    run this backward again: states_in_place()); done where the Gluon scan writes them (it reads each S_n before it
    writes slot n), after the query backward, the other reader of S, on one stream."""
    b, T, hq, d = q.shape
    hk = k.shape[2]
    NC = T // C
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = lse if not norm else torch.zeros(1, **f32)
    IDX, MULT, TILE, F, L = _tables(p, d, q.device)
    fast = sym2.applies(p, d, q.dtype)                 # as in the forward
    atomic = sym2.atomic_updates()                     # dq / dk updates of the p=2 backward kernels (both alike)
    DS = state_dim(p, d)
    sp = scale ** p
    block = config.chunk.current().discumsum_block     # elements of the flattened state per _discumsum program
    dy = dy.contiguous()
    # Delta = dy . y (b,T,hq): formed and stored by the intra-chunk dq kernel, which runs first
    delta = torch.empty(b, T, hq, **f32) if norm else dummy
    # intra-chunk attention backward with the combined normalizer (lse = log of the total)
    # with the row-scaled dv kernel (the last to write dv) dv stays in the inputs' dtype throughout: the intra-chunk
    # part is rounded once before the state part is added in fp32 (saves an fp32 copy and a conversion pass); dq and
    # dk likewise where the Gluon query backward / key dk finish them (INTRA_GRADS_LOW)
    p2 = p2_config.current()
    # the state kernels that run in Gluon (bf16 inputs only)
    qbwd_gluon = fast and sym2.row_scaled_qbwd(d) and sym2.gluon_rows_applies("qbwd", q, d)
    kdk_gluon = fast and sym2.gluon_rows_applies("kdk", k, d)
    dq_low = qbwd_gluon
    dk_low = kdk_gluon
    dq = torch.empty_like(q) if dq_low else torch.empty(b, T, hq, d, **f32)
    dk = torch.empty_like(k) if dk_low else torch.empty(b, T, hk, d, **f32)
    dv = torch.empty_like(v) if fast else torch.empty(b, T, hk, d, **f32)
    dgq = torch.empty(b, T, hq, **f32) if gated else dummy
    dgk = torch.empty(b, T, hk, **f32) if gated else dummy
    dot_dt, prec = _dot_dtype(q.dtype, norm, True)
    kv_cfg, q_cfg = (_launch_cfg(d, kernel, dot_dt, prec) for kernel in ("dkdv", "dq"))
    common = dict(HQ=hq, HK=hk, D=d, P=p, NORM=norm, GATED=gated)
    nb = b * NC
    cq, ck, cv, cdy, cy, cdq, cdk, cdv = (_chunk_view(x, nb, C) for x in (q, k, v, dy, y, dq, dk, dv))
    cG, cdgq, cdgk = (_chunk_view(x, nb, C, gated) for x in (G, dgq, dgk))
    cl, cdl = (_chunk_view(x, nb, C, norm) for x in (lse, delta))
    # the query side's scaled copy for the Gluon outer products (and its normalizer weights), written by dq
    copy_q = (sym2.scaled_copy_buffers(q, T, hq, d, norm, False)
              if _copy_in_attention(fast, q, d, C, False) else None)
    cw = _chunk_view(copy_q[1], nb, C, norm) if copy_q else None
    # the query side's reverse scan and then the key kernels may run on a side stream (config concurrent_bwd): the
    # scan needs only the intra-chunk dq's copies and Delta, the key kernels the intra-chunk dk / dv, and the
    # intra-chunk dk / dv and the query backward need neither. Every buffer either chain writes is allocated on the
    # caller's stream before the fork and the caller's stream waits for the side stream before returning, so no
    # memory is freed or reused while the other stream may still use it.
    side = sym2.side_stream(q.device, "bwd") if p2.concurrent_bwd and fast and q.is_cuda else None
    in_place = states_in_place and fast and sym2.gluon_scan_applies(q, d, C)
    if in_place:        # S must be read by the query backward before the scan writes over it: one stream, in order
        side = None

    def slice_inputs(sl):
        """A chunk-batch slice's launch size and its gate, log-normalizer and Delta views (dummies where unused)."""
        return sl.stop - sl.start, (cG[sl] if gated else G), (cl[sl] if norm else cl), (cdl[sl] if norm else cdl)

    for sl in _chunk_batches(nb, hq):
        n_sl, g_, l_, d_ = slice_inputs(sl)
        side_args = dict(XT=copy_q[0], W=cw[sl] if norm else cw, sqrt_scale_p=sp ** 0.5, CB0=sl.start, NCH=NC,
                         T_FULL=T, XT_MODE=2) if copy_q else {}
        _attn_bwd_dq[(triton.cdiv(C, q_cfg["BM"]), n_sl * hq)](
            cq[sl], ck[sl], cv[sl], g_, cdy[sl], l_, d_, cdq[sl], cdgq[sl] if gated else dgq, scale, sp, C,
            GATE_SCORES=config.attention.current().gate_scores, O=cy[sl], DELTA_OUT=norm, **common, **q_cfg,
            **side_args)
    del cdq                                 # a view that would keep an fp32 dq alive after its conversion

    def intra_dkdv():
        for sl in _chunk_batches(nb, hq):
            n_sl, g_, l_, d_ = slice_inputs(sl)
            _attn_bwd_dkdv[(triton.cdiv(C, kv_cfg["BN"]), n_sl * hk)](
                cq[sl], ck[sl], cv[sl], g_, cdy[sl], l_, d_, cdk[sl], cdv[sl], cdgk[sl] if gated else dgk, scale,
                sp, C, **common, **kv_cfg)

    # state term
    sdt, sprec = _state_operands(q.dtype)
    rows, BD, warps, stages = _chunk_blocks(F, d, sdt)
    sizes = dict(D=d, P=p, TILE=TILE, F=F, C=C, GATED=gated, DOT_DT=sdt, PREC=sprec, num_warps=warps,
                 num_stages=stages)
    dgq2 = torch.empty(b, T, hq, **f32) if gated else dummy
    # the p=2 kernels write the finished dq / dk in the inputs' dtype themselves (CAST: no conversion pass)
    cast = fast and q.dtype != torch.float32
    dq_out = dq if dq_low or not cast else torch.empty_like(q)

    def query_state():
        if qbwd_gluon:
            from .chunk_p2.gluon_rows import gluon_query_bwd_rows
            bm, warps_, nbuf = p2.qbwd_block
            gluon_query_bwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
                q, G, S, Z, dy, lse, delta, dq, dq_out, dgq2, sp,
                T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE, MINW=sym2.gluon_window_min(d, "qbwd"), BM=bm, NORM=norm,
                GATED=gated, HAS_S0=has_s0, NBUF=nbuf, CAST=cast, STEP=p2.bwd_step[0],
                num_warps=warps_, **sym2.gluon_rows_regs("qbwd"))
        elif fast and sym2.row_scaled_qbwd(d):
            _, bm, _, _ = sym2.blocks("qbwd_rows", d)
            sym2._sym2_query_bwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
                q, G, S, Z, dy, lse, delta, dq, dq_out, dgq2, sp, T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE,
                KW2=sym2.half_window(d), BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
                ATOMIC=atomic, PIPE=p2.qbwd_pipe, CAST=cast, **sym2.launch_options("qbwd_rows", d))
        elif fast:
            jg, bm, _, _ = sym2.blocks("qbwd", d)
            grp = sym2.groups(d, jg, q.device)
            sym2._sym2_query_bwd[(triton.cdiv(C, bm), NC, b * hq)](
                q, G, grp, S, Z, dy, lse, delta, dq, dq_out, dgq2, sp, T, NC, DS, grp.shape[0], HQ=hq, HK=hk, D=d,
                C=C, TW=TILE, JG=jg, BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
                ATOMIC=atomic, CAST=cast, **sym2.launch_options("qbwd", d))
        else:
            _query_state_bwd[(triton.cdiv(C, rows), NC, b * hq)](
                q, G, IDX, S, Z, dy, lse, delta, dq, dgq2, sp, T, NC, DS, L, HQ=hq, HK=hk, BM=rows, NORM=norm,
                HAS_S0=has_s0, **sizes)
        # dq is complete: with fp32 intermediates its buffer is released (before dR exists, on one stream)
        return dq_out.to(q.dtype)

    if side is None:    # one stream, in order: dq's fp32 buffer (if any) is released before dR exists
        intra_dkdv()
        dq = query_state()
    # dR slot n (n < NC): direct gradient of S_n from chunk n's queries (parallel over chunks); slot NC:
    # the returned state's gradient; the reverse discumsum makes slot n = dL/dS_n, so dU_n = slot n+1
    # and d initial_state = slot 0
    dR = S if in_place else torch.empty(b, hk, NC + 1, DS, d, device=q.device, dtype=S.dtype)
    dRz = torch.empty(b, hk, NC + 1, DS, **f32)
    for slot, g in ((dR[:, :, NC], dsf), (dRz[:, :, NC], dzf)):
        if g is None:        # the final state unused: no materialized zeros to copy
            slot.zero_()
        else:
            slot.copy_(g)
    ds0, dz0 = dR[:, :, 0], dRz[:, :, 0]
    dU, dUz, NU = dR[:, :, 1:], dRz[:, :, 1:], NC + 1       # offset views: the kernel strides by NU
    # dU with the key side's multiplicities (the scan writes them) where both key kernels run in Gluon
    du_mult = fast and p2.du_mult and kdk_gluon and sym2.gluon_rows_applies("kdv", k, d)
    dgk2 = torch.empty(b, T, hk, **f32) if gated else dummy
    dk_out = dk if dk_low or not cast else torch.empty_like(k)

    def state_grads():
        """dL/dS_n of every chunk (dR) and the chunks' gate gradients dgt; whether dU
        carries the key multiplicities."""
        scanned, dgt_scan = False, None
        if fast:
            scanned, dgt_scan = sym2.launch_outer(q, dy, G, lse, delta, dR, dRz, sp, T, NC, DS, 0, hq, hk, d, C,
                                                  False, norm, gated, sdt, sprec, scan=True, fwd_states=(S, Z),
                                                  du_mult=du_mult, copy=copy_q)
        else:
            _query_grad_state[(NC * L, d // BD, b * hk)](
                q, G, IDX, dy, lse, delta, dR, dRz, sp, T, NC, DS, L, HQ=hq, HK=hk, BM=rows, BD=BD, NORM=norm,
                **sizes)
        if scanned:
            return (dgt_scan if gated else dummy), du_mult
        dgts = []
        for X, Sf, M in ((dR, S, DS * d), (dRz, Z, DS)):
            nblk = triton.cdiv(M, block)
            dgt_ = torch.empty(b * hk, nblk, NC, **f32) if gated else dummy
            _discumsum[(nblk, b * hk)](
                X, G, Sf, dgt_, M, T, NC, HK=hk, C=C, BLOCK=block, GATED=gated, REVERSE=True,
                num_warps=4)
            dgts.append(dgt_)
        dgt_ = (dgts[0].view(b, hk, -1, NC).sum(2) + dgts[1].view(b, hk, -1, NC).sum(2)) if gated else dummy
        return dgt_, False

    def key_state(du_mult):
        if not fast:
            _update_state_bwd[(triton.cdiv(C, rows), NC, b * hk)](
                k, v, G, IDX, MULT, dU, dUz, dk, dv, dgk2, T, NC, DS, L, NU, HK=hk, BK=rows, **sizes)
            return
        if kdk_gluon:
            from .chunk_p2.gluon_rows import gluon_key_dk_rows
            bk, warps_, nbuf = p2.kdk_block
            gluon_key_dk_rows[(triton.cdiv(C, bk), NC, b * hk)](
                k, v, G, dU, dUz, dk, dk_out, dgk2, T, NC, DS, NU, HK=hk, D=d, C=C, TW=TILE,
                MINW=sym2.gluon_window_min(d, "kdk"), BK=bk, GATED=gated, NBUF=nbuf, CAST=cast, DU_MULT=du_mult,
                STEP=p2.bwd_step[1], num_warps=warps_, **sym2.gluon_rows_regs("kdk"))
        else:
            jg, bk, _, _ = sym2.blocks("kbwd", d)
            grp = sym2.groups(d, jg, q.device)
            sym2._sym2_key_bwd[(triton.cdiv(C, bk), NC, b * hk)](
                k, v, G, grp, dU, dUz, dk, dk_out, dv, dgk2, T, NC, DS, grp.shape[0], NU, HK=hk, D=d, C=C, TW=TILE,
                JG=jg, BK=bk, GATED=gated, DOT_DT=sdt, PREC=sprec, ATOMIC=atomic, DV_TOO=False, CAST=cast,
                **sym2.launch_options("kbwd", d))
        if sym2.gluon_rows_applies("kdv", k, d):
            from .chunk_p2.gluon_rows import gluon_key_dv_rows
            bk, warps_, nbuf = p2.kdv_block
            gluon_key_dv_rows[(triton.cdiv(C, bk), NC, b * hk)](
                k, G, dU, dv, T, NC, DS, NU, HK=hk, D=d, C=C, TW=TILE, MINW=sym2.gluon_window_min(d, "kdv"), BK=bk,
                GATED=gated, NBUF=nbuf, DU_MULT=du_mult, num_warps=warps_, **sym2.gluon_rows_regs("kdv"))
        else:
            _, bk, _, _ = sym2.blocks("kdv_rows", d)
            sym2._sym2_key_dv_rows[(triton.cdiv(C, bk), NC, b * hk)](
                k, G, dU, dv, T, NC, DS, NU, HK=hk, D=d, C=C, TW=TILE, KW2=sym2.half_window(d), BK=bk, GATED=gated,
                DOT_DT=sdt, PREC=sprec, PIPE=p2.kdv_pipe, ACC=True, **sym2.launch_options("kdv_rows", d))

    if side is None:
        dgt, du_mult = state_grads()
        key_state(du_mult)
    else:
        main = torch.cuda.current_stream(q.device)
        side.wait_stream(main)                  # the intra-chunk dq's copies and Delta, dR's last slot
        with torch.cuda.stream(side):
            dgt, du_mult = state_grads()
        intra_dkdv()
        side.wait_stream(main)                  # the intra-chunk dk / dv, which the key kernels finish
        dq = query_state()
        with torch.cuda.stream(side):
            key_state(du_mult)
        main.wait_stream(side)
    del cdk, copy_q, cw
    if fast:
        dk = dk_out
    dgl = None
    if gated:
        rep = hq // hk
        dgl = dgk + dgk2 + (dgq + dgq2).view(b, T, hk, rep).sum(-1)    # (b,T,hk)
        end = (-dgk2).view(b, NC, C, hk).sum(2) + dgt.transpose(1, 2)
        dgl = dgl.view(b, NC, C, hk)
        dgl[:, :, C - 1] += end                                          # gt_n = g at the chunk's last token
        dgl = dgl.view(b, T, hk)
    ds0 = ds0.float().contiguous() if has_s0 else None
    del dU, dUz
    del dR, dRz
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgl, ds0, dz0.contiguous() if has_s0 else None
