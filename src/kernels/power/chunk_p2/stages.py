"""The p=2 chunked form as named stages, one entry per direction (chunk.py calls `forward` / `backward` where the
call's plan names this family: plan.p2_family decides it): the shared intra-chunk attention (chunk_stages.py), then

    forward:   update_states (outer products + scan over chunks) -> query_states (queries against each S_n)
    backward:  intra dq -> state_grads (query-side outer products + reverse scan) -> key_backward (dk, dv)
               intra dk/dv -> query_backward (dq's state part)

Which kernel runs a stage (Gluon on Hopper with bf16, Triton elsewhere: the interpreter, other GPUs, fp32 under
config force) is decided inside the stage. Buffers and slots as chunk.py's docstring.
"""
from __future__ import annotations

import torch
import triton

from ..chunk_stages import (gate_grads, intra_backward_dkdv, intra_backward_dq, intra_forward, new_states,
                            fill_final_grads, scan_state_grads, scan_states, state_operands)
from ..reference import state_dim
from . import config, kernels
from .config import TILE2


def _copy_in_attention(x, d: int, C: int) -> bool:
    """Whether the intra-chunk attention writes the Gluon outer products' scaled copy of x (keys or queries)."""
    return kernels.gluon_outer_applies(x, d, C)


# ----------------------------------------------------------------------------------------------
# forward stages
# ----------------------------------------------------------------------------------------------
def update_states(k, v, G, S, Z, scale_p, C, norm, gated, copy_k):
    """Slots 1..NC of S / Z = the states after each chunk: the keys' outer products, scanned over the chunks in the
    same pass (Gluon) or by chunk_stages.scan_states."""
    b, T, hk, d = k.shape
    NC, DS = T // C, S.shape[3]
    sdt, sprec = state_operands(k.dtype)
    # (the keys read no lse / Delta: Z stands in for them)
    scanned, _ = kernels.launch_outer(k, v, G, Z, Z, S, Z, scale_p, T, NC, DS, 1, hk, hk, d, C, True, norm,
                                      gated, sdt, sprec, copy=copy_k)
    if not scanned:
        scan_states(S, Z, G, T, C, gated)


def query_states(q, G, S, Z, o_intra, lse_intra, y, lse, scale_p, C, norm, gated, has_s0):
    """y (and lse, the log of the total normalizer): each chunk's queries against the state entering it, combined
    with the intra-chunk output (row-scaled: slices of S_n scale the rows of plain matmuls)."""
    b, T, hq, d = q.shape
    hk, NC, DS = S.shape[1], T // C, S.shape[3]
    if kernels.gluon_rows_apply(q, d):
        from .gluon_rows import gluon_query_fwd_rows
        bm, warps, nbuf = config.current().qfwd_block
        gluon_query_fwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
            q, G, S, Z, o_intra, lse_intra, y, lse, scale_p, T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE2,
            MINW=kernels.gluon_window_min(d), BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, NBUF=nbuf,
            num_warps=warps, **kernels.gluon_rows_regs("qfwd"))
        return
    sdt, sprec = state_operands(q.dtype)
    _, bm, _, _ = kernels.blocks("qfwd_rows", d)
    kernels._sym2_query_fwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
        q, G, S, Z, o_intra, lse_intra, y, lse, scale_p, T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE2,
        KW2=kernels.half_window(d), BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
        PIPE=config.current().qfwd_pipe, **kernels.launch_options("qfwd_rows", d))


def forward(q, k, v, gl, s0, z0, scale: float, norm: bool, C: int):
    """chunk.chunked_forward for the p=2 family: (y, S, Z, lse, G). bf16 inputs keep the intra output and the
    per-chunk states in bf16 (bf16 matmul operands anyway; sums stay fp32 in registers): half the memory."""
    b, T, hq, d = q.shape
    hk, NC, dev = k.shape[2], T // C, q.device
    gated = gl is not None
    f32 = dict(device=dev, dtype=torch.float32)
    dummy = torch.zeros(1, **f32)
    G = gl.contiguous() if gated else dummy
    sp = scale ** 2
    low = q.dtype == torch.bfloat16
    o_intra = torch.empty(b, T, hq, d, device=dev, dtype=torch.bfloat16 if low else torch.float32)
    lse_intra = torch.empty(b, T, hq, **f32) if norm else dummy
    # the keys' scaled copy for the Gluon outer products, written by the attention kernel (it holds those rows)
    copy_k = kernels.scaled_copy_buffers(k, T, hk, d, norm, True) if _copy_in_attention(k, d, C) else None
    intra_forward(q, k, v, G, o_intra, lse_intra, scale, C, 2, norm, gated, copy_k)
    S, Z = new_states(b, hk, NC, state_dim(2, d), d, s0, z0, dev, torch.bfloat16 if low else torch.float32)
    update_states(k, v, G, S, Z, sp, C, norm, gated, copy_k)
    del copy_k
    y = torch.empty_like(q)
    lse = torch.empty(b, T, hq, **f32) if norm else dummy
    query_states(q, G, S, Z, o_intra, lse_intra, y, lse, sp, C, norm, gated, s0 is not None)
    return y, S, Z, lse, G


# ----------------------------------------------------------------------------------------------
# backward stages
# ----------------------------------------------------------------------------------------------
def query_backward(q, G, S, Z, dy, lse, delta, dq, dq_out, dgq_state, scale_p, C, norm, gated, has_s0, cast):
    """dq's state part (dq holds the intra-chunk part; the finished dq goes to dq_out, in the inputs' dtype with
    cast) and the query gate terms dgq_state; row-scaled below config grouped_qbwd_min_d, else grouped."""
    b, T, hq, d = q.shape
    hk, NC, DS = S.shape[1], T // C, S.shape[3]
    sdt, sprec = state_operands(q.dtype)
    atomic = kernels.atomic_updates()
    if kernels.row_scaled_qbwd(d) and kernels.gluon_rows_apply(q, d):
        from .gluon_rows import gluon_query_bwd_rows
        cfg = config.current()
        bm, warps, nbuf = cfg.qbwd_block
        gluon_query_bwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
            q, G, S, Z, dy, lse, delta, dq, dq_out, dgq_state, scale_p,
            T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE2, BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, NBUF=nbuf,
            CAST=cast, num_warps=warps, **kernels.gluon_rows_regs("qbwd"))
    elif kernels.row_scaled_qbwd(d):
        _, bm, _, _ = kernels.blocks("qbwd_rows", d)
        kernels._sym2_query_bwd_rows[(triton.cdiv(C, bm), NC, b * hq)](
            q, G, S, Z, dy, lse, delta, dq, dq_out, dgq_state, scale_p, T, NC, DS, HQ=hq, HK=hk, D=d, C=C, TW=TILE2,
            KW2=kernels.half_window(d), BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
            ATOMIC=atomic, PIPE=config.current().qbwd_pipe, CAST=cast, **kernels.launch_options("qbwd_rows", d))
    else:
        jg, bm, _, _ = kernels.blocks("qbwd", d)
        grp = kernels.groups(d, jg, q.device)
        kernels._sym2_query_bwd[(triton.cdiv(C, bm), NC, b * hq)](
            q, G, grp, S, Z, dy, lse, delta, dq, dq_out, dgq_state, scale_p, T, NC, DS, grp.shape[0], HQ=hq, HK=hk,
            D=d, C=C, TW=TILE2, JG=jg, BM=bm, NORM=norm, GATED=gated, HAS_S0=has_s0, DOT_DT=sdt, PREC=sprec,
            ATOMIC=atomic, CAST=cast, **kernels.launch_options("qbwd", d))


def state_grads(q, dy, G, lse, delta, dR, dRz, S, Z, scale_p, C, norm, gated, du_mult, copy_q):
    """dL/dS_n of every chunk into slot n of dR / dRz (slot NC holds the returned state's gradient): the query side's
    outer products, scanned in reverse in the same pass (Gluon; with du_mult, slots 1..NC carry the key side's
    multiplicities) or by chunk_stages.scan_state_grads. Returns (dgt (b, hk, NC) or None, whether dU carries the
    multiplicities)."""
    b, T, hq, d = q.shape
    hk, NC, DS = S.shape[1], T // C, S.shape[3]
    sdt, sprec = state_operands(q.dtype)
    scanned, dgt = kernels.launch_outer(q, dy, G, lse, delta, dR, dRz, scale_p, T, NC, DS, 0, hq, hk, d, C, False,
                                        norm, gated, sdt, sprec, fwd_states=(S, Z), du_mult=du_mult, copy=copy_q)
    if scanned:
        return dgt, du_mult
    return scan_state_grads(dR, dRz, G, S, Z, T, C, gated), False


def key_backward(k, v, G, dU, dUz, dk, dk_out, dv, dgk_state, C, gated, cast, du_mult):
    """The key side's state part: dk (the finished dk to dk_out with cast, as query_backward), dv and the key gate
    terms, from dU_n = dL/dS_{n+1} (dU / dUz: offset views of dR / dRz, NC + 1 slots per (b, hk))."""
    b, T, hk, d = k.shape
    NC, NU, DS = T // C, dU.shape[2] + 1, dU.shape[3]
    sdt, sprec = state_operands(k.dtype)
    cfg = config.current()
    gluon = kernels.gluon_rows_apply(k, d)
    if gluon:
        from .gluon_rows import gluon_key_dk_rows, gluon_key_dv_rows
        bk, warps, nbuf = cfg.kdk_block
        gluon_key_dk_rows[(triton.cdiv(C, bk), NC, b * hk)](
            k, v, G, dU, dUz, dk, dk_out, dgk_state, T, NC, DS, NU, HK=hk, D=d, C=C, TW=TILE2,
            BK=bk, GATED=gated, NBUF=nbuf, CAST=cast, DU_MULT=du_mult, num_warps=warps,
            **kernels.gluon_rows_regs("kdk"))
        bk, warps, nbuf = cfg.kdv_block
        gluon_key_dv_rows[(triton.cdiv(C, bk), NC, b * hk)](
            k, G, dU, dv, T, NC, DS, NU, HK=hk, D=d, C=C, TW=TILE2, MINW=kernels.gluon_window_min(d), BK=bk,
            GATED=gated, NBUF=nbuf, DU_MULT=du_mult, num_warps=warps, **kernels.gluon_rows_regs("kdv"))
        return
    jg, bk, _, _ = kernels.blocks("kbwd", d)
    grp = kernels.groups(d, jg, k.device)
    kernels._sym2_key_bwd[(triton.cdiv(C, bk), NC, b * hk)](
        k, v, G, grp, dU, dUz, dk, dk_out, dv, dgk_state, T, NC, DS, grp.shape[0], NU, HK=hk, D=d, C=C, TW=TILE2,
        JG=jg, BK=bk, GATED=gated, DOT_DT=sdt, PREC=sprec, ATOMIC=kernels.atomic_updates(), CAST=cast,
        **kernels.launch_options("kbwd", d))
    _, bk, _, _ = kernels.blocks("kdv_rows", d)
    kernels._sym2_key_dv_rows[(triton.cdiv(C, bk), NC, b * hk)](
        k, G, dU, dv, T, NC, DS, NU, HK=hk, D=d, C=C, TW=TILE2, KW2=kernels.half_window(d), BK=bk, GATED=gated,
        DOT_DT=sdt, PREC=sprec, PIPE=cfg.kdv_pipe, **kernels.launch_options("kdv_rows", d))


def backward(dy, dsf, dzf, q, k, v, G, S, Z, y, lse, scale: float, norm: bool, gated: bool, C: int, has_s0: bool,
             states_in_place: bool = False):
    """chunk.chunked_backward for the p=2 family: (dq, dk, dv, dgl, ds0, dz0). Two independent chains (state_grads
    then key_backward; intra dk/dv then query_backward) run on two streams on CUDA (config concurrent_bwd).
    states_in_place: dL/dS_n is written over the forward's states S where the Gluon scan writes them (it reads each
    S_n before it writes slot n), after query_backward, the other reader of S, on one stream."""
    b, T, hq, d = q.shape
    hk, NC = k.shape[2], T // C
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = lse if not norm else torch.zeros(1, **f32)
    sp = scale ** 2
    dy = dy.contiguous()
    # Delta = dy . y (b,T,hq): formed and stored by the intra-chunk dq kernel, which runs first
    delta = torch.empty(b, T, hq, **f32) if norm else dummy
    # dv stays in the inputs' dtype throughout (the row-scaled dv kernel is the last to write it): the intra-chunk
    # part is rounded once before the state part is added in fp32; dq and dk likewise where the Gluon query backward
    # / key dk finish them
    qbwd_gluon = kernels.row_scaled_qbwd(d) and kernels.gluon_rows_apply(q, d)
    kdk_gluon = kernels.gluon_rows_apply(k, d)
    dq = torch.empty_like(q) if qbwd_gluon else torch.empty(b, T, hq, d, **f32)
    dk = torch.empty_like(k) if kdk_gluon else torch.empty(b, T, hk, d, **f32)
    dv = torch.empty_like(v)
    dgq, dgk = (torch.empty(b, T, h, **f32) if gated else dummy for h in (hq, hk))
    # the queries' scaled copy for the Gluon outer products (and its normalizer weights), written by dq
    copy_q = kernels.scaled_copy_buffers(q, T, hq, d, norm, False) if _copy_in_attention(q, d, C) else None
    # the query side's reverse scan and then the key kernels may run on a side stream: the scan needs only the
    # intra-chunk dq's copies and Delta, the key kernels the intra-chunk dk / dv, and the intra-chunk dk / dv and
    # the query backward need neither. Every buffer either chain writes is allocated on the caller's stream before
    # the fork and the caller's stream waits for the side stream before returning, so no memory is freed or reused
    # while the other stream may still use it.
    in_place = states_in_place and kernels.gluon_outer_applies(q, d, C)
    # S must be read by the query backward before the scan writes over it: one stream, in order
    side = (kernels.side_stream(q.device, "bwd") if q.is_cuda and config.current().concurrent_bwd and not in_place
            else None)
    intra_backward_dq(q, k, v, G, dy, y, lse, delta, dq, dgq, scale, C, 2, norm, gated, copy_q)
    dgq_state = torch.empty(b, T, hq, **f32) if gated else dummy
    # the p=2 kernels write the finished dq / dk in the inputs' dtype themselves (CAST: no conversion pass)
    cast = q.dtype != torch.float32
    dq_out = dq if qbwd_gluon or not cast else torch.empty_like(q)

    def intra_dkdv():
        intra_backward_dkdv(q, k, v, G, dy, lse, delta, dk, dv, dgk, scale, C, 2, norm, gated)

    def query_state():
        query_backward(q, G, S, Z, dy, lse, delta, dq, dq_out, dgq_state, sp, C, norm, gated, has_s0, cast)
        # dq is complete: with fp32 intermediates its buffer is released (before dR exists, on one stream)
        return dq_out.to(q.dtype)

    if side is None:
        intra_dkdv()
        dq = query_state()
    # dR slot n (n < NC): the direct gradient of S_n from chunk n's queries; slot NC: the returned state's gradient;
    # the reverse scan makes slot n = dL/dS_n, so dU_n = slot n+1 and d initial_state = slot 0
    dR = S if in_place else torch.empty(b, hk, NC + 1, S.shape[3], d, device=q.device, dtype=S.dtype)
    dRz = torch.empty(b, hk, NC + 1, S.shape[3], **f32)
    fill_final_grads(dR, dRz, dsf, dzf, NC)
    ds0, dz0 = dR[:, :, 0], dRz[:, :, 0]
    dU, dUz = dR[:, :, 1:], dRz[:, :, 1:]
    # dU with the key side's multiplicities (the Gluon scan writes them) where the key kernels run in Gluon
    du_mult = kdk_gluon
    dgk_state = torch.empty(b, T, hk, **f32) if gated else dummy
    dk_out = dk if kdk_gluon or not cast else torch.empty_like(k)

    def scan_chain():
        return state_grads(q, dy, G, lse, delta, dR, dRz, S, Z, sp, C, norm, gated, du_mult, copy_q)

    if side is None:
        dgt, du_mult = scan_chain()
        key_backward(k, v, G, dU, dUz, dk, dk_out, dv, dgk_state, C, gated, cast, du_mult)
    else:
        main = torch.cuda.current_stream(q.device)
        side.wait_stream(main)                  # the intra-chunk dq's copies and Delta, dR's last slot
        with torch.cuda.stream(side):
            dgt, du_mult = scan_chain()
        intra_dkdv()
        side.wait_stream(main)                  # the intra-chunk dk / dv, which the key kernels finish
        dq = query_state()
        with torch.cuda.stream(side):
            key_backward(k, v, G, dU, dUz, dk, dk_out, dv, dgk_state, C, gated, cast, du_mult)
        main.wait_stream(side)
    del copy_q
    dgl = gate_grads(dgk, dgk_state, dgq, dgq_state, dgt, C) if gated else None
    ds0 = ds0.float().contiguous() if has_s0 else None
    dz0 = dz0.contiguous() if has_s0 else None
    return dq.to(q.dtype), dk_out.to(k.dtype), dv.to(v.dtype), dgl, ds0, dz0
