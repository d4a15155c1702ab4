"""Chunked form of power attention in Triton (forward + backward), with the tiled symmetric-power expansion done
on the fly inside the matmuls ("expand-MMA": phi(K) / phi(Q) never exist in HBM): every p, dtype and head dim. Where
the call's plan names the p=2 family (plan.p2_family decides it) chunked_forward / chunked_backward hand the call to
chunk_p2.forward / chunk_p2.backward; both compose the shared stages of chunk_stages.py (intra-chunk attention, scans,
gate gradients).

Math (reference.py `_block`, docs/kernels.md). Chunk n covers tokens [nC, nC + C); g = chunk-local
cumulative log-gate (g_i = sum of log_g from the chunk start to i), gt_n = g at the chunk's last token, s = scale:

    intra_i  = attention form on the chunk alone (reuses parallel._attn_fwd: y_intra, lse_intra)
    U_n      = sum_{j in n} w phi(k_j) e^(gt_n - g_j) v_j^T,  Uz_n = same with v_j -> 1   (update-state, expand-M)
    S_{n+1}  = e^(gt_n) S_n + U_n   (discumsum; S_0 = initial state)
               _update_state_fwd computes every chunk's U_n in parallel (grid over chunk x state tile x value
               block x b*hk) into slot n+1 of the state buffer, then chunk_stages._discumsum (elementwise, one
               program per block of the flattened state, walking the chunks) turns the slots into the states
               entering each chunk, in place.
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
    _query_grad_state computes every Q_n in parallel, chunk_stages._discumsum(REVERSE) accumulates in place (and the
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

from . import chunk_p2, tunables
from ._common import _combine_store, _has_state, _key_block, _key_rows, _kv_heads, _query_block, _row_factor
from .chunk_stages import (gate_grads, intra_backward_dkdv, intra_backward_dq, intra_forward, new_state_grads,
                           new_states, scan_state_grads, scan_states, state_operands)
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
# state kernels run for all chunks in parallel (the scan over chunks is chunk_stages._discumsum)
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


def state_tile_key(p, d, dtype) -> tuple:
    """The tunables table's key of the generic state kernels' launch (rows per step BK/BM, value columns per state
    program BD, warps, stages) for degree p, head dim d and inputs of `dtype` (their operands: state_operands):
    chunk_state for expanded tiles of F = tile^p <= 64 features, chunk_state_wide above."""
    F = state_tile(p, d) ** p
    return tunables.key("chunk_state" if F <= 64 else "chunk_state_wide", d, state_operands(dtype)[0])


def _state_launch(p, d, dtype, device):
    """The generic state kernels' shared constexprs and launch options, and their (rows, BD, L, IDX, MULT)."""
    IDX, MULT, TILE, F, L = _tables(p, d, device)
    sdt, sprec = state_operands(dtype)
    rows, BD, warps, stages = tunables.TABLE[state_tile_key(p, d, dtype)]
    sizes = dict(D=d, P=p, TILE=TILE, F=F, DOT_DT=sdt, PREC=sprec, num_warps=warps, num_stages=stages)
    return sizes, rows, BD, L, IDX, MULT


def chunked_forward(q, k, v, gl, s0, z0, scale: float, p: int, norm: bool, C: int, family: str):
    """The chunked form's forward launches: (y, S, Z, lse, G) with S / Z the states entering each chunk and the
    final one (b, hk, NC+1, D_s, d) / (b, hk, NC+1, D_s), G the contiguous gl or a dummy. Arguments as
    autograd.ChunkedForm's; q, k, v contiguous. family: the plan's ("p2" runs chunk_p2's own stages)."""
    b, T, hq, d = q.shape
    if family == "p2":
        return chunk_p2.forward(q, k, v, gl, s0, z0, scale, norm, C)
    hk, NC, dev = k.shape[2], T // C, q.device
    gated = gl is not None
    f32 = dict(device=dev, dtype=torch.float32)
    dummy = torch.zeros(1, **f32)
    G = gl.contiguous() if gated else dummy
    DS, sp = state_dim(p, d), scale ** p
    sizes, rows, BD, L, IDX, MULT = _state_launch(p, d, q.dtype, dev)
    # 1. each chunk's attention alone
    o_intra = torch.empty(b, T, hq, d, **f32)
    lse_intra = torch.empty(b, T, hq, **f32) if norm else dummy
    intra_forward(q, k, v, G, o_intra, lse_intra, scale, C, p, norm, gated)
    # 2. U_n of every chunk in parallel -> slots 1..NC; 3. the scan turns them into the states entering each chunk
    S, Z = new_states(b, hk, NC, DS, d, s0, z0, dev, torch.float32)
    _update_state_fwd[(NC * L, d // BD, b * hk)](k, v, G, IDX, MULT, S, Z, T, NC, DS, L, HK=hk, C=C, BK=rows, BD=BD,
                                                 GATED=gated, **sizes)
    scan_states(S, Z, G, T, C, gated)
    # 4. each chunk's queries against the state entering it, combined with the intra-chunk output
    y = torch.empty_like(q)
    lse = torch.empty(b, T, hq, **f32) if norm else dummy
    _query_state_fwd[(triton.cdiv(C, rows), NC, b * hq)](
        q, G, IDX, S, Z, o_intra, lse_intra, y, lse, sp, T, NC, DS, L, HQ=hq, HK=hk, C=C, BM=rows, NORM=norm,
        GATED=gated, HAS_S0=s0 is not None, **sizes)
    return y, S, Z, lse, G


def chunked_backward(dy, dsf, dzf, q, k, v, G, S, Z, y, lse, scale: float, p: int, norm: bool, gated: bool, C: int,
                     has_s0: bool, family: str, states_in_place: bool = False):
    """The chunked form's backward launches: (dq, dk, dv, dgl, ds0, dz0) from the forward's tensors
    (chunked_forward) and the gradients of y and of the final state (dsf, dzf: fp32, or None where unused: zeros).
    states_in_place: the state gradients may be written over the forward's states S (the caller will not run this
    backward again: autograd.states_in_place); only the p=2 family does. family: as chunked_forward's."""
    b, T, hq, d = q.shape
    if family == "p2":
        return chunk_p2.backward(dy, dsf, dzf, q, k, v, G, S, Z, y, lse, scale, norm, gated, C, has_s0,
                                 states_in_place)
    hk, NC = k.shape[2], T // C
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = lse if not norm else torch.zeros(1, **f32)
    DS, sp = state_dim(p, d), scale ** p
    sizes, rows, BD, L, IDX, MULT = _state_launch(p, d, q.dtype, q.device)
    dy = dy.contiguous()
    # 1. the intra-chunk attention's gradients with the combined normalizer (lse = log of the total); dq first: it
    # forms Delta = dy . y
    delta = torch.empty(b, T, hq, **f32) if norm else dummy
    dq, dk, dv = (torch.empty(x.shape, **f32) for x in (q, k, v))
    dgq, dgk, dgq_state, dgk_state = (torch.empty(b, T, h, **f32) if gated else dummy for h in (hq, hk, hq, hk))
    intra_backward_dq(q, k, v, G, dy, y, lse, delta, dq, dgq, scale, C, p, norm, gated)
    intra_backward_dkdv(q, k, v, G, dy, lse, delta, dk, dv, dgk, scale, C, p, norm, gated)
    # 2. the query side of the state term: dq += dL/dphi(q) contracted, its gate terms
    _query_state_bwd[(triton.cdiv(C, rows), NC, b * hq)](
        q, G, IDX, S, Z, dy, lse, delta, dq, dgq_state, sp, T, NC, DS, L, HQ=hq, HK=hk, C=C, BM=rows, NORM=norm,
        GATED=gated, HAS_S0=has_s0, **sizes)
    # 3. the state gradients: each chunk's direct part (slot n), then the reverse scan makes slot n = dL/dS_n
    dR, dRz = new_state_grads(S, dsf, dzf, NC)
    _query_grad_state[(NC * L, d // BD, b * hk)](
        q, G, IDX, dy, lse, delta, dR, dRz, sp, T, NC, DS, L, HQ=hq, HK=hk, C=C, BM=rows, BD=BD, NORM=norm,
        GATED=gated, **sizes)
    dgt = scan_state_grads(dR, dRz, G, S, Z, T, C, gated)
    # 4. the key side: dU_n = dL/dS_{n+1} (offset views, NC + 1 slots per (b, hk))
    _update_state_bwd[(triton.cdiv(C, rows), NC, b * hk)](
        k, v, G, IDX, MULT, dR[:, :, 1:], dRz[:, :, 1:], dk, dv, dgk_state, T, NC, DS, L, NC + 1, HK=hk, C=C,
        BK=rows, GATED=gated, **sizes)
    dgl = gate_grads(dgk, dgk_state, dgq, dgq_state, dgt, C) if gated else None
    ds0 = dR[:, :, 0].float().contiguous() if has_s0 else None
    dz0 = dRz[:, :, 0].contiguous() if has_s0 else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgl, ds0, dz0
