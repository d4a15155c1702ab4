"""The stages every chunked form shares (the generic one in chunk.py and the p=2 family in chunk_p2/), as FLA's
`fla/ops/common` serves its op folders: the intra-chunk attention (the attention-form kernels with each chunk one
batch entry), the state buffers, the gated scan over chunks (_discumsum) and the gate gradients' assembly. Buffers,
slots and the math are chunk.py's docstring's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import config
from ._common import _kv_heads
from . import parallel
from .parallel import dot_dtype, launch_config, launch_fwd


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
def chunk_batches(nb, heads):
    """Slices of the b*NC chunk-batch such that one intra-chunk launch has <= max_grid_y programs in grid dim 1."""
    step = max(1, config.chunk.current().max_grid_y // heads)
    return [slice(i, min(i + step, nb)) for i in range(0, nb, step)]


def chunk_view(x, nb, C, real=True):
    """(b, NC*C, ...) -> (b*NC, C, ...): each chunk one batch entry. Placeholders (real=False) pass through."""
    return x.view(nb, C, *x.shape[2:]) if real else x


def state_operands(dtype):
    """Operand dtype and precision of the state matmuls: bf16 for bf16 inputs (fp32 accumulation), else fp32
    operands as tf32x3 (fp16: phi of large-norm inputs can exceed 65504)."""
    return (tl.bfloat16, "tf32") if dtype == torch.bfloat16 else (tl.float32, "tf32x3")


def intra_tiles(d, kernel, dtype, norm, C):
    """The tile constexprs and launch options of the intra-chunk attention kernel `kernel` ("fwd", "dkdv", "dq") on
    chunks of C rows: the one place that picks them (parallel.blocks' chunked entries)."""
    return launch_config(d, kernel, *dot_dtype(dtype, norm, kernel != "fwd"), chunked=True, t=C)


def intra_forward(q, k, v, G, o, lse, scale, C, p, norm, gated, copy_k=None):
    """Stage 1 of the forward: every chunk's attention alone into o / lse (the chunk's log-normalizer). copy_k: (XT,
    W) of chunk_p2's scaled_copy_buffers, written by the same kernel (the keys' scaled copy the Gluon outer products
    read)."""
    b, T, hq, d = q.shape
    hk, NC, nb = k.shape[2], T // C, b * (T // C)
    cq, ck, cv, co = (chunk_view(x, nb, C) for x in (q, k, v, o))
    cG, cl = chunk_view(G, nb, C, gated), chunk_view(lse, nb, C, norm)
    cfg = intra_tiles(d, "fwd", q.dtype, norm, C)
    for sl in chunk_batches(nb, hq):
        side = dict(XT=copy_k[0], CB0=sl.start, NCH=NC, T_FULL=T, XT_MODE=1) if copy_k else {}
        launch_fwd(cq[sl], ck[sl], cv[sl], cG[sl] if gated else G, co[sl], cl[sl] if norm else cl, scale, scale ** p,
                   C, (sl.stop - sl.start) * hq, hq, hk, d, p, norm, gated, cfg, **side)


def intra_backward_dq(q, k, v, G, dy, y, lse, delta, dq, dgq, scale, C, p, norm, gated, copy_q=None):
    """The intra-chunk attention's dq and query gate terms (dgq), with lse the combined normalizer's log; it also
    forms Delta = dy . y into delta. copy_q: (XT, W) of the queries' scaled copy, written by the same kernel."""
    b, T, hq, d = q.shape
    hk, NC, nb = k.shape[2], T // C, b * (T // C)
    cq, ck, cv, cdy, cy, cdq = (chunk_view(x, nb, C) for x in (q, k, v, dy, y, dq))
    cG, cdgq = chunk_view(G, nb, C, gated), chunk_view(dgq, nb, C, gated)
    cl, cdl = chunk_view(lse, nb, C, norm), chunk_view(delta, nb, C, norm)
    cw = chunk_view(copy_q[1], nb, C, norm) if copy_q else None
    cfg = intra_tiles(d, "dq", q.dtype, norm, C)
    sp = scale ** p
    for sl in chunk_batches(nb, hq):
        side = dict(XT=copy_q[0], W=cw[sl] if norm else cw, sqrt_scale_p=sp ** 0.5, CB0=sl.start, NCH=NC, T_FULL=T,
                    XT_MODE=2) if copy_q else {}
        parallel._attn_bwd_dq[(triton.cdiv(C, cfg["BM"]), (sl.stop - sl.start) * hq)](
            cq[sl], ck[sl], cv[sl], cG[sl] if gated else G, cdy[sl], cl[sl] if norm else cl,
            cdl[sl] if norm else cdl, cdq[sl], cdgq[sl] if gated else dgq, scale, sp, C, O=cy[sl], DELTA_OUT=norm,
            HQ=hq, HK=hk, D=d, P=p, NORM=norm, GATED=gated, **cfg, **side)


def intra_backward_dkdv(q, k, v, G, dy, lse, delta, dk, dv, dgk, scale, C, p, norm, gated):
    """The intra-chunk attention's dk, dv and key gate terms (dgk); delta as intra_backward_dq formed it."""
    b, T, hq, d = q.shape
    hk, nb = k.shape[2], b * (T // C)
    cq, ck, cv, cdy, cdk, cdv = (chunk_view(x, nb, C) for x in (q, k, v, dy, dk, dv))
    cG, cdgk = chunk_view(G, nb, C, gated), chunk_view(dgk, nb, C, gated)
    cl, cdl = chunk_view(lse, nb, C, norm), chunk_view(delta, nb, C, norm)
    cfg = intra_tiles(d, "dkdv", q.dtype, norm, C)
    for sl in chunk_batches(nb, hq):
        parallel._attn_bwd_dkdv[(triton.cdiv(C, cfg["BN"]), (sl.stop - sl.start) * hk)](
            cq[sl], ck[sl], cv[sl], cG[sl] if gated else G, cdy[sl], cl[sl] if norm else cl,
            cdl[sl] if norm else cdl, cdk[sl], cdv[sl], cdgk[sl] if gated else dgk, scale, scale ** p, C,
            HQ=hq, HK=hk, D=d, P=p, NORM=norm, GATED=gated, **cfg)


def new_states(b, hk, NC, DS, d, s0, z0, device, dtype):
    """The state buffers S (b, hk, NC+1, DS, d) in `dtype` / Z (b, hk, NC+1, DS) fp32 with slot 0 = the initial state
    (zeros without one); slots 1..NC are the update stage's."""
    S = torch.empty(b, hk, NC + 1, DS, d, device=device, dtype=dtype)
    Z = torch.empty(b, hk, NC + 1, DS, device=device, dtype=torch.float32)
    if s0 is not None:
        S[:, :, 0] = s0
        Z[:, :, 0] = z0
    else:
        S[:, :, 0].zero_()
        Z[:, :, 0].zero_()
    return S, Z


def new_state_grads(S, dsf, dzf, NC):
    """The state-gradient buffers dR (like S) / dRz (fp32) with slot NC = the returned state's gradient (zeros where
    unused); slots 0..NC-1 are the state-gradient stage's."""
    b, hk, _, DS, d = S.shape
    dR = torch.empty(b, hk, NC + 1, DS, d, device=S.device, dtype=S.dtype)
    dRz = torch.empty(b, hk, NC + 1, DS, device=S.device, dtype=torch.float32)
    fill_final_grads(dR, dRz, dsf, dzf, NC)
    return dR, dRz


def fill_final_grads(dR, dRz, dsf, dzf, NC):
    """Slot NC of dR / dRz: the gradients of the returned state (None where unused: zeros, none materialized)."""
    for slot, g in ((dR[:, :, NC], dsf), (dRz[:, :, NC], dzf)):
        if g is None:
            slot.zero_()
        else:
            slot.copy_(g)


def scan_states(S, Z, G, T, C, gated):
    """The forward scan: slots n+1 = S_{n+1} = e^(gt_n) S_n + U_n, in place (S, Z hold U_n in slot n+1)."""
    b, hk, n1, DS, d = S.shape
    block = config.chunk.current().discumsum_block     # elements of the flattened state per _discumsum program
    for X, M in ((S, DS * d), (Z, DS)):
        _discumsum[(triton.cdiv(M, block), b * hk)](X, G, G, G, M, T, n1 - 1, HK=hk, C=C, BLOCK=block, GATED=gated,
                                                    REVERSE=False, num_warps=4)


def scan_state_grads(dR, dRz, G, S, Z, T, C, gated):
    """The reverse scan: slot n = dL/dS_n = Q_n + e^(gt_n) dL/dS_{n+1}, in place (dR, dRz hold Q_n in slot n); returns
    the chunks' gate gradients dgt (b, hk, NC) = e^(gt_n) <S_n, dL/dS_{n+1}> (S and z parts) if gated, else None."""
    b, hk, n1, DS, d = S.shape
    NC = n1 - 1
    block = config.chunk.current().discumsum_block
    dgts = []
    for X, Sf, M in ((dR, S, DS * d), (dRz, Z, DS)):
        nblk = triton.cdiv(M, block)
        dgt = torch.empty(b * hk, nblk, NC, device=S.device, dtype=torch.float32) if gated else G
        _discumsum[(nblk, b * hk)](X, G, Sf, dgt, M, T, NC, HK=hk, C=C, BLOCK=block, GATED=gated, REVERSE=True,
                                   num_warps=4)
        dgts.append(dgt)
    return sum(x.view(b, hk, -1, NC).sum(2) for x in dgts) if gated else None


def gate_grads(dgk, dgk_state, dgq, dgq_state, dgt, C):
    """d(chunk-local G) (b, T, hk) from the intra-chunk terms (dgk, dgq), the state terms (dgk_state, dgq_state) and
    the chunks' totals dgt (b, hk, NC), which belong to gt_n = G at each chunk's last token."""
    b, T, hk = dgk.shape
    NC, rep = T // C, dgq.shape[2] // hk
    dgl = dgk + dgk_state + (dgq + dgq_state).view(b, T, hk, rep).sum(-1)
    end = (-dgk_state).view(b, NC, C, hk).sum(2) + dgt.transpose(1, 2)
    dgl = dgl.view(b, NC, C, hk)
    dgl[:, :, C - 1] += end
    return dgl.view(b, T, hk)
