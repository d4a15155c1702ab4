"""Pure-PyTorch power attention: the truth the Triton kernels are tested against, and the CPU path.

Math (docs/kernels.md): with G = cumsum(log_g) per head and s the scale,

    A_ij = (s q_i . k_j)^p * exp(G_i - G_j)   for j <= i
    y_i  = sum_j A_ij v_j / sum_j A_ij        (norm=True, even p)
    y_i  = sum_j A_ij v_j                     (norm=False, any p)

Two forms live here, both differentiable by torch autograd:
- `attention_form`: the quadratic (t x t) form, with the log-space power for the normalized case;
- `chunked_form`: the linear form with a recurrent state at chunk boundaries, in the tiled
  symmetric-power feature space `phi` (the same state layout the GPU kernels use).

Normalized outputs are computed stabilized: with a per-row stabilizer M_i (the largest log-term),
y_i = (N_i e^-M_i) / (D_i e^-M_i + EPS). The stabilized denominator is >= 1 whenever the row has a
finite largest term, so EPS only changes results at the 1e-6 relative level and keeps an all-zero row
finite (output 0).
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import NamedTuple, Optional

import torch

EPS = 1e-6          # added to the stabilized normalizer (which is >= 1): guards all-zero rows
LOG_TINY = -69.0    # log(1e-30): |s q.k| below 1e-30 is treated as 1e-30 in the log-space power
M_FLOOR = -60.0     # lowest row stabilizer, so exp(-M) stays finite in fp32


class PowerState(NamedTuple):
    """Recurrent state of power attention after some tokens (per key/value head).

    s: (b, hk, D, d) float32 -- sum_j w * phi(k_j) v_j^T, gated to the last processed token.
    z: (b, hk, D)    float32 -- the same sum with v replaced by 1 (the normalizer's state).
    D = state_dim(p, d): the tiled symmetric power of the head dim (see `state_tile`).
    """
    s: torch.Tensor
    z: torch.Tensor


# ----------------------------------------------------------------------------------------------
# tiled symmetric power phi: phi(q) . (w * phi(k)) = (q . k)^p
# ----------------------------------------------------------------------------------------------
_PREFERRED_TILE = {1: None, 2: 8, 3: 4, 4: 4}  # paper: 8 for p=2, 4 for p=3; p=1 is the identity


def state_tile(p: int, d: int) -> int:
    """Tile size of the tiled symmetric power for degree p and head dim d (divides d)."""
    tile = _PREFERRED_TILE.get(p) or d
    tile = min(tile, d)
    while d % tile:
        tile //= 2
    return tile


@lru_cache(maxsize=None)
def _ndmi(n_tiles: int, p: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Non-decreasing multi-indices over tiles (lexicographic) and their multiplicities p!/prod(c!)."""
    idx = list(itertools.combinations_with_replacement(range(n_tiles), p))
    mult = []
    for combo in idx:
        m = math.factorial(p)
        for c in set(combo):
            m //= math.factorial(combo.count(c))
        mult.append(float(m))
    return tuple(idx), tuple(mult)


def state_dim(p: int, d: int) -> int:
    """D, the feature dimension of the tiled symmetric power of degree p of a d-vector."""
    tile = state_tile(p, d)
    idx, _ = _ndmi(d // tile, p)
    return len(idx) * tile ** p


def expand(x: torch.Tensor, p: int, weighted: bool = False) -> torch.Tensor:
    """Tiled symmetric power: (..., d) -> (..., D). `weighted` multiplies each tile block by its
    multiplicity (used on the key side only, so that expand(q) . expand(k, weighted=True) = (q.k)^p)."""
    d = x.shape[-1]
    tile = state_tile(p, d)
    idx, mult = _ndmi(d // tile, p)
    xt = x.reshape(*x.shape[:-1], d // tile, tile)                      # (..., n_tiles, tile)
    index = torch.tensor(idx, device=x.device)                          # (L, p)
    out = xt[..., index[:, 0], :]                                       # (..., L, tile)
    for z in range(1, p):
        nxt = xt[..., index[:, z], :]
        out = (out[..., :, None] * nxt[..., None, :]).flatten(-2)       # (..., L, tile^(z+1))
    if weighted:
        out = out * torch.tensor(mult, device=x.device, dtype=x.dtype)[:, None]
    return out.flatten(-2)                                              # (..., D)


def symmetrize_diagonal_blocks(s: torch.Tensor, d: int) -> torch.Tensor:
    """p=2 states (..., D, e) with each diagonal block (tiles (t, t), whose features (a, b) and (b, a) both have a
    row) replaced by the mean of it and its transpose: what phi(q) . s sees of s (phi(q) is symmetric there), and the
    only part the p=2 kernels' backward over the symmetric completion (chunk_p2 gluon_rows._sym_pass) reads right."""
    tile = state_tile(2, d)
    blocks = s.reshape(*s.shape[:-2], -1, tile, tile, s.shape[-1])
    diagonal = _diagonal_blocks(d, str(s.device))[:, None, None, None]
    return torch.where(diagonal, 0.5 * (blocks + blocks.transpose(-3, -2)), blocks).reshape(s.shape)


@lru_cache(maxsize=None)     # one host-to-device copy per (d, device), not one per call
def _diagonal_blocks(d: int, device: str) -> torch.Tensor:
    """Which blocks of the p=2 tiled layout are diagonal (tiles (t, t)), as a bool tensor on `device`."""
    idx, _ = _ndmi(d // state_tile(2, d), 2)
    return torch.tensor([a == b for a, b in idx], device=device)


# ----------------------------------------------------------------------------------------------
# the two forms; all tensors here are (b, h, t, d) and already in the compute dtype
# ----------------------------------------------------------------------------------------------
def _causal_scores(qs, k, gq, gk, p, norm):
    """Per-row pieces of the quadratic form on one block (causal, query i sees keys j <= i).

    qs (b,h,tq,d) scaled queries; k (b,h,tk,d); gq (b,h,tq), gk (b,h,tk) local cumulative log-gates,
    query i aligned with key i (tq == tk). Returns (P, m): P (b,h,tq,tk) such that the numerator is
    P @ v; m (b,h,tq) the detached log-stabilizer (norm=True) or None (norm=False, P unscaled)."""
    t = qs.shape[-2]
    s = qs @ k.transpose(-1, -2)                                        # (b,h,t,t)
    causal = torch.ones(t, t, dtype=torch.bool, device=qs.device).tril()
    gate = (gq[..., :, None] - gk[..., None, :]).masked_fill(~causal, float("-inf"))
    if not norm:
        return s.pow(p) * gate.exp(), None
    logs = p * s.abs().clamp_min(math.exp(LOG_TINY)).log() + gate     # log-space power
    m = logs.amax(-1).detach().clamp_min(M_FLOOR)                       # (b,h,t)
    P = (logs - m[..., None]).exp()
    if p % 2:
        P = P * s.sign()
    return P, m


def _combine(num, den, m, inter_num, inter_den, norm):
    """Output of one block: intra-block (num, den, m) plus the state term (inter_num, inter_den)."""
    if not norm:
        return num if inter_num is None else num + inter_num
    if inter_num is None:
        return num / (den + EPS)[..., None]
    big = torch.maximum(m, inter_den.detach().clamp_min(1e-30).log())  # row stabilizer M
    a = (m - big).exp()
    b_ = (-big).exp()
    return (num * a[..., None] + inter_num * b_[..., None]) / (den * a + inter_den * b_ + EPS)[..., None]


def _gqa(x, rep):
    """(b, hk, ...) -> (b, hk*rep, ...), kv head j serves query heads j*rep .. j*rep+rep-1."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def _block(qs, k, v, lg, p, norm, state, want_state):
    """One block of tokens against an optional incoming state. lg (b,hk,t) log-gates of the block.
    Returns (y (b,hq,t,d), new state or None)."""
    hq, hk = qs.shape[1], k.shape[1]
    rep = hq // hk
    g = lg.cumsum(-1)                                                   # local G, (b,hk,t)
    P, m = _causal_scores(qs, _gqa(k, rep), _gqa(g, rep), _gqa(g, rep), p, norm)
    num = P @ _gqa(v, rep)
    den = P.sum(-1) if norm else None
    inter_num = inter_den = None
    if state is not None:
        qg = qs * (_gqa(g, rep) / p).exp()[..., None]                   # gate folded into q
        b, _, t, d = qs.shape
        fq = expand(qg.reshape(b, hk, rep * t, d), p)                   # (b,hk,rep*t,D)
        inter_num = (fq @ state.s).reshape(b, hq, t, -1)
        inter_den = (fq @ state.z[..., None]).reshape(b, hq, t)
    y = _combine(num, den, m, inter_num, inter_den, norm)
    new_state = None
    if want_state:
        total = g[..., -1:]                                             # (b,hk,1)
        kg = k * ((total - g) / p).exp()[..., None]                     # gate to block end
        fk = expand(kg, p, weighted=True)                               # (b,hk,t,D)
        s_new = fk.transpose(-1, -2) @ v                                # (b,hk,D,d)
        z_new = fk.sum(-2)                                              # (b,hk,D)
        if state is not None:
            decay = total.exp()                                         # (b,hk,1)
            s_new = s_new + state.s * decay[..., None]
            z_new = z_new + state.z * decay
        new_state = PowerState(s_new, z_new)
    return y, new_state


def power_attention_reference(q, k, v, log_g=None, *, p=2, scale=None, chunk_size=None, norm=True,
                              initial_state: Optional[PowerState] = None, return_state=False):
    """Reference power attention (inputs already validated). q (b,t,hq,d), k/v (b,t,hk,d),
    log_g (b,t,hk) or None. chunk_size None: one block (quadratic form); else the chunked form with a
    state every `chunk_size` tokens. Computes in float32 (float64 for float64 inputs); returns y in
    q's dtype, plus the final PowerState (float32/64) if return_state."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    b, t, hq, d = q.shape
    hk = k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    qs = (q.to(cdt) * scale).transpose(1, 2)                            # (b,hq,t,d)
    kt = k.to(cdt).transpose(1, 2)                                      # (b,hk,t,d)
    vt = v.to(cdt).transpose(1, 2)
    lg = (torch.zeros(b, hk, t, dtype=cdt, device=q.device) if log_g is None
          else log_g.to(cdt).transpose(1, 2))                           # (b,hk,t)
    state = None
    if initial_state is not None:
        state = PowerState(initial_state.s.to(cdt), initial_state.z.to(cdt))
    c = t if chunk_size is None else chunk_size
    ys = []
    for start in range(0, t, c):
        sl = slice(start, min(start + c, t))
        last = sl.stop == t
        y, new_state = _block(qs[:, :, sl], kt[:, :, sl], vt[:, :, sl], lg[:, :, sl], p, norm, state,
                              want_state=(not last) or return_state)
        ys.append(y)
        state = new_state
    y = torch.cat(ys, dim=2).transpose(1, 2).to(q.dtype)                # (b,t,hq,d)
    return (y, state) if return_state else y
