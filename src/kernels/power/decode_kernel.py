"""One token of power attention in one Triton launch: state update, query and normalizer fused (decoding).

Per token and layer the step reads and writes the whole state once (s (b, hk, D, d) and z (b, hk, D), fp32) and
does almost no arithmetic, so it is one launch that streams the state at full bandwidth instead of the dozen small
kernels of the plain-torch step (decode.power_state_step, the reference it is checked against). Grid: (b*hk, SPLIT):
each program owns a contiguous range of BLOCK_D feature rows of one head's state, applies

    S <- S exp(log_g) + phi_w(k) v^T,   z <- z exp(log_g) + phi_w(k)

to them in place (log_g given, or computed from the forget gate's input: logsigmoid(x . w_h + b_h), so the gate
needs no launches of its own), and sums its rows' share of phi(s q) S and phi(s q) . z. With SPLIT > 1 the shares
go to a small fp32 scratch buffer and an atomic ticket per head elects the head's last program, which adds the
shares in a fixed order (deterministic), normalizes, writes y and resets the ticket for the next token: one launch,
nothing read back by the host, so it can be captured in a CUDA graph. phi is the kernels' tiled symmetric power,
as gather indices (decode.symmetric_power_indices): phi(x)[e] = prod_z x[index[z, e]].
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from . import tunables
from .reference import EPS, M_FLOOR

# warps of a program, and programs the split puts on an SM at once (the tunables table's decode_step row)
NUM_WARPS, PROGRAMS_PER_SM = tunables.tile("decode_step", 64)


@triton.jit
def _power_decode_step(
    S, Z, IDX, W,               # state (B, HK, D, DV), normalizer (B, HK, D) fp32; index (P, D) i32, weight (D,) fp32
    Q, K, V, LOG_G,             # q (B, HQ, DV), k, v (B, HK, DV): float, last dim contiguous; log_g (B, HK) fp32
    Y, PART_N, PART_D, TICKET,  # y (B, HQ, DV); scratch (SPLIT, B, HQ, DV), (SPLIT, B, HQ) fp32; tickets (B*HK,) i32
    GX, GW, GB,                 # GATED == 2: the gate's input x (B, DX), weight (HK, DX), bias (HK,); contiguous rows
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_gb, stride_gh, stride_yb, stride_yh,
    stride_xb, B, HK, D, DX, BLOCKS_PER_SPLIT, scale,
    P: tl.constexpr, REP: tl.constexpr, REP_P2: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, GATED: tl.constexpr, NORM: tl.constexpr, EPS_: tl.constexpr, DEN_FLOOR: tl.constexpr,
    BLOCK_X: tl.constexpr = 256, SPLIT_CHUNK: tl.constexpr = 64, STATE_FIRST: tl.constexpr = False,
):
    # GATED: 0 no gate; 1 log_g given; 2 log_g = logsigmoid(x . w_h + b_h) computed here (a per-head forget gate:
    # its matmul and activation need no launches of their own), so the decay exp(log_g) = sigmoid(x . w_h + b_h)
    pid_bh = tl.program_id(0)                                   # b * HK + h
    pid_split = tl.program_id(1)
    i_b = pid_bh // HK
    i_h = pid_bh % HK
    offs_v = tl.arange(0, DV)                                   # (DV,)
    offs_r = tl.arange(0, REP_P2)                               # (REP_P2,) query heads of this key head
    mask_r = offs_r < REP
    heads_q = i_h * REP + offs_r                                # (REP_P2,)

    k_row = K + i_b * stride_kb + i_h * stride_kh
    q_rows = Q + i_b * stride_qb + heads_q * stride_qh          # (REP_P2,) pointers
    v_vec = tl.load(V + i_b * stride_vb + i_h * stride_vh + offs_v).to(tl.float32)   # (DV,)
    if GATED == 1:
        decay = tl.exp(tl.load(LOG_G + i_b * stride_gb + i_h * stride_gh).to(tl.float32))
    if GATED == 2:
        if STATE_FIRST:  # computed after the first block's state loads are issued (below)
            decay = tl.full((), 1.0, dtype=tl.float32)
        else:
            decay = _gate_decay(GX, GW, GB, i_b, i_h, stride_xb, DX, BLOCK_X)

    state_row0 = pid_bh.to(tl.int64) * D                        # this head's first feature row
    num = tl.zeros((REP_P2, DV), dtype=tl.float32)              # sum_e phi(q)[r, e] S[e, :]
    den = tl.zeros((REP_P2,), dtype=tl.float32)                 # sum_e phi(q)[r, e] z[e]
    n_blocks = tl.cdiv(D, BLOCK_D)
    first = pid_split * BLOCKS_PER_SPLIT
    last = tl.minimum(first + BLOCKS_PER_SPLIT, n_blocks)
    for blk in range(first, last):
        offs_d = blk * BLOCK_D + tl.arange(0, BLOCK_D)          # (BLOCK_D,) feature rows
        mask_d = offs_d < D
        s_ptrs = S + (state_row0 + offs_d[:, None]) * DV + offs_v[None, :]                   # (BLOCK_D, DV)
        z_ptrs = Z + state_row0 + offs_d
        if STATE_FIRST:   # the state's loads issued before the gate and the feature gathers: latencies overlap
            s = tl.load(s_ptrs, mask=mask_d[:, None], other=0.0)
            zz = tl.load(z_ptrs, mask=mask_d, other=0.0)
            if GATED == 2:
                if blk == first:
                    decay = _gate_decay(GX, GW, GB, i_b, i_h, stride_xb, DX, BLOCK_X)
        phi_k = tl.load(W + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        phi_q = tl.full((REP_P2, BLOCK_D), 1.0, dtype=tl.float32)
        for z in tl.static_range(P):
            idx = tl.load(IDX + z * D + offs_d, mask=mask_d, other=0)                       # (BLOCK_D,) i32
            phi_k *= tl.load(k_row + idx).to(tl.float32)
            q_g = tl.load(q_rows[:, None] + idx[None, :], mask=mask_r[:, None], other=0.0)   # (REP_P2, BLOCK_D)
            phi_q *= q_g.to(tl.float32) * scale

        if not STATE_FIRST:
            s = tl.load(s_ptrs, mask=mask_d[:, None], other=0.0)
            zz = tl.load(z_ptrs, mask=mask_d, other=0.0)
        if GATED != 0:
            s = s * decay
            zz = zz * decay
        s += phi_k[:, None] * v_vec[None, :]
        zz += phi_k
        tl.store(s_ptrs, s, mask=mask_d[:, None])
        tl.store(z_ptrs, zz, mask=mask_d)
        if REP_P2 == 1:                                         # one query head a key head: 2-D products only
            phi_q1 = tl.reshape(phi_q, (BLOCK_D,))
            num += tl.reshape(tl.sum(phi_q1[:, None] * s, axis=0), (1, DV))
            if NORM:
                den += tl.sum(phi_q1 * zz, axis=0)
        else:
            # GQA: 2-D products one query head at a time, each into its row of num and den (a joint 3-D (heads,
            # rows, d) product gave wrong outputs on sm_90 with Triton 3.6 at p=4, 2 heads)
            for r in tl.static_range(REP):
                row = offs_r == r                                                           # (REP_P2,)
                phi_r = tl.sum(tl.where(row[:, None], phi_q, 0.0), axis=0)                  # (BLOCK_D,) head r's
                num += tl.where(row[:, None], tl.sum(phi_r[:, None] * s, axis=0)[None, :], 0.0)
                if NORM:
                    den += tl.where(row, tl.sum(phi_r * zz, axis=0), 0.0)

    y_ptrs = Y + i_b * stride_yb + heads_q[:, None] * stride_yh + offs_v[None, :]          # (REP_P2, DV)
    if SPLIT == 1:
        _finish(y_ptrs, num, den, mask_r, NORM, EPS_, DEN_FLOOR)
    else:
        # this program's share into the scratch, then the ticket: the head's last program reads every share
        part = (pid_split * B + i_b) * (HK * REP) + heads_q                                # (REP_P2,) rows
        tl.store(PART_N + part[:, None] * DV + offs_v[None, :], num, mask=mask_r[:, None])
        tl.store(PART_D + part, den, mask=mask_r)
        tl.debug_barrier()                                       # every thread's share is written before the ticket
        ticket = tl.atomic_add(TICKET + pid_bh, 1, sem="acq_rel")
        if ticket == SPLIT - 1:
            # every share, SPLIT_CHUNK programs' at a time in one wide load (their latencies overlap), added in a
            # fixed order: the same sum at every launch
            num = tl.zeros((REP_P2, DV), dtype=tl.float32)
            den = tl.zeros((REP_P2,), dtype=tl.float32)
            for c in range(0, SPLIT, SPLIT_CHUNK):
                offs_s = c + tl.arange(0, SPLIT_CHUNK)                                       # (SPLIT_CHUNK,)
                rows = (offs_s[:, None] * B + i_b) * (HK * REP) + heads_q[None, :]           # (SPLIT_CHUNK, REP_P2)
                mask_sr = (offs_s[:, None] < SPLIT) & mask_r[None, :]
                shares = tl.load(PART_N + rows[:, :, None] * DV + offs_v[None, None, :], mask=mask_sr[:, :, None],
                                 other=0.0, volatile=True)                                   # (SPLIT_CHUNK, REP_P2, DV)
                num += tl.sum(shares, axis=0)
                den += tl.sum(tl.load(PART_D + rows, mask=mask_sr, other=0.0, volatile=True), axis=0)
            _finish(y_ptrs, num, den, mask_r, NORM, EPS_, DEN_FLOOR)
            tl.atomic_xchg(TICKET + pid_bh, 0)                   # ready for the next token


@triton.jit
def _gate_decay(GX, GW, GB, i_b, i_h, stride_xb, DX, BLOCK_X: tl.constexpr):
    """The head's forget-gate decay sigmoid(x . w_h + b_h), fp32, from the gate's input row and parameters."""
    acc = tl.zeros((BLOCK_X,), dtype=tl.float32)
    for c in range(0, DX, BLOCK_X):
        offs_x = c + tl.arange(0, BLOCK_X)
        mask_x = offs_x < DX
        xv = tl.load(GX + i_b * stride_xb + offs_x, mask=mask_x, other=0.0).to(tl.float32)
        acc += xv * tl.load(GW + i_h * DX + offs_x, mask=mask_x, other=0.0).to(tl.float32)
    return tl.sigmoid(tl.sum(acc, axis=0) + tl.load(GB + i_h).to(tl.float32))


@triton.jit
def _finish(y_ptrs, num, den, mask_r, NORM: tl.constexpr, EPS_: tl.constexpr, DEN_FLOOR: tl.constexpr):
    """y = num / (den + EPS max(den, e^M_FLOOR)) (the reference's guard; an all-zero row gives 0), or num."""
    if NORM:
        den = tl.maximum(den, 0.0)
        num = num / (den + EPS_ * tl.maximum(den, DEN_FLOOR))[:, None]
    tl.store(y_ptrs, num.to(y_ptrs.dtype.element_ty), mask=mask_r[:, None])


_SM_COUNT: dict = {}


def _sm_count(device: torch.device) -> int:
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT[device]


def block_rows(d: int, rep: int = 1) -> int:
    """Feature rows per block: a (BLOCK_D, d) fp32 state tile that, times the query heads a key head serves (GQA:
    each multiplies the tile), holds 8192 elements (64 registers a thread at 4 warps; 128 rows at d=64 without GQA,
    32 with 4 query heads a key head, where a larger tile spills). Half the tile (more, smaller programs) took 1.4x
    as long per GPT-2 small layer at batch 1 on an H200: fewer programs each streaming more state hide the step's
    chain of dependent loads better."""
    return max(16, 8192 // (d * triton.next_power_of_2(rep)))


def split_for(D: int, d: int, heads: int, sms: int, block_d: Optional[int] = None) -> tuple[int, int]:
    """(programs per head, blocks per program): at most one wave of PROGRAMS_PER_SM on every SM, none empty."""
    n_blocks = triton.cdiv(D, block_d or block_rows(d))
    split = max(1, min(n_blocks, PROGRAMS_PER_SM * sms // heads))
    per = triton.cdiv(n_blocks, split)
    return triton.cdiv(n_blocks, per), per


def power_decode_step_kernel(s, z, index, weight, ticket, q, k, v, log_g: Optional[torch.Tensor], p: int,
                             norm: bool, scale: float, split: Optional[int] = None,
                             block_d: Optional[int] = None, gate: Optional[tuple] = None,
                             reduce_chunk: int = 64, state_first: bool = False) -> torch.Tensor:
    """Launch the fused step: s (b, hk, D, d), z (b, hk, D) fp32, contiguous, updated in place; index (p, D) int32,
    weight (D,) fp32; ticket (b*hk,) int32 zeros (left zero after the launch); q (b, 1, hq, d), k, v (b, 1, hk, d);
    log_g (b, 1, hk) or None -> y (b, 1, hq, d) in q's dtype; or gate (x (b, 1, dx), w (hk, dx), bias (hk,)) in
    place of log_g: log_g = logsigmoid(x w^T + bias) in fp32, computed in the kernel. split: programs per head
    (default: split_for); block_d: feature rows per block (default: block_rows; tests take small ones to split tiny
    states); reduce_chunk: programs' shares the head's last program reads per load; state_first: the state's loads
    issued before the gate's and the feature gathers (the last two: launch-shape knobs the benchmark times, same
    numbers)."""
    b, _, hq, d = q.shape
    hk, D = k.shape[2], s.shape[2]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    y = torch.empty_like(q, memory_format=torch.contiguous_format)
    block_d = block_d or block_rows(d, hq // hk)
    if split is None:
        split = split_for(D, d, b * hk, _sm_count(q.device) if q.is_cuda else 1, block_d)[0]
    n_blocks = triton.cdiv(D, block_d)
    per = triton.cdiv(n_blocks, split)
    split = triton.cdiv(n_blocks, per)
    part_n = torch.empty((split, b, hq, d) if split > 1 else (1,), device=q.device, dtype=torch.float32)
    part_d = torch.empty((split, b, hq) if split > 1 else (1,), device=q.device, dtype=torch.float32)
    if gate is not None:
        gx, gw, gb = gate
        gx = gx if gx.stride(-1) == 1 else gx.contiguous()
        gw, gb = gw.contiguous(), gb.contiguous()
        mode, x_stride, dx = 2, gx.stride(0), gw.shape[1]
    else:
        gx = gw = gb = s                                       # unread pointers
        mode, x_stride, dx = int(log_g is not None), 0, 0
    rep = hq // hk
    _power_decode_step[(b * hk, split)](
        s, z, index, weight, q, k, v, log_g if log_g is not None else s, y, part_n, part_d, ticket, gx, gw, gb,
        q.stride(0), q.stride(2), k.stride(0), k.stride(2), v.stride(0), v.stride(2),
        *((log_g.stride(0), log_g.stride(2)) if log_g is not None else (0, 0)), y.stride(0), y.stride(2),
        x_stride, b, hk, D, dx, per, scale,
        P=p, REP=rep, REP_P2=triton.next_power_of_2(rep), DV=d, BLOCK_D=block_d, SPLIT=split,
        GATED=mode, NORM=norm, EPS_=EPS, DEN_FLOOR=math.exp(M_FLOOR), SPLIT_CHUNK=reduce_chunk,
        STATE_FIRST=state_first, num_warps=NUM_WARPS)
    return y
