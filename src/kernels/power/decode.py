"""One token of power attention against its recurrent state, updated in place: the decoding step.

Plain torch ops on preallocated buffers, so the same code runs on CPU, inside a captured CUDA graph, or compiled;
`symmetric_power_indices` gives the gather indices of the tiled symmetric power the kernels and the reference use
(reference.expand), so the state this step updates is the one the chunked kernels return after a prompt.
"""
from __future__ import annotations

import math

import torch

from .reference import EPS, M_FLOOR, _ndmi, state_tile


def symmetric_power_indices(p: int, d: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices and key weights of the kernels' tiled symmetric power (reference.expand): for x (..., d),
    expand(x) = prod_z x[..., index[z]] and expand(x, weighted=True) = that * weight. index (p, D) int64, weight
    (D,) float32. Feature e = (tile combination l, in-tile offsets i_1..i_p) reads x[combo_l[z] * tile + i_z]."""
    tile = state_tile(p, d)
    combos, mult = _ndmi(d // tile, p)
    combos = torch.tensor(combos, dtype=torch.int64).view(-1, p)                   # (L, p)
    e = torch.arange(len(combos) * tile ** p)
    l, r = e // tile ** p, e % tile ** p
    index = torch.stack([combos[l, z] * tile + (r // tile ** (p - 1 - z)) % tile for z in range(p)])
    weight = torch.tensor(mult, dtype=torch.float32)[l]
    return index.to(device), weight.to(device)


def power_state_step(s, z, index, weight, q, k, v, log_g, p: int, norm: bool, scale: float):
    """One token of power attention against the state s (b, hk, D, d), z (b, hk, D), updated in place:

        S <- S exp(log_g) + phi_w(k) v^T,   z <- z exp(log_g) + phi_w(k),   y = phi(s q) S / (phi(s q) . z)

    (norm=False: y = phi(s q) S). phi = prod_z x[..., index[z]] (symmetric_power_indices), phi_w = phi * weight.
    The query reads the state after the update: the token attends to itself. The division guards a zero row as the
    reference does, y = N / (D + EPS max(D, e^M_FLOOR)) (an all-zero row gives 0). q (b, 1, hq, d), k, v (b, 1, hk, d),
    log_g (b, 1, hk) fp32 or None -> y (b, 1, hq, d) in q's dtype. Plain torch ops: the same on CPU, in a CUDA graph,
    or compiled."""
    b, _, hq, d = q.shape
    hk = k.shape[2]
    cdt = s.dtype
    with torch.autocast(q.device.type, enabled=False):                        # the state stays fp32
        kf, qf = k[:, 0].to(cdt), q[:, 0].to(cdt) * scale
        fk, fq = kf[..., index[0]], qf[..., index[0]]
        for i in range(1, p):
            fk, fq = fk * kf[..., index[i]], fq * qf[..., index[i]]
        fk = fk * weight                                                        # (b, hk, D)
        fq = fq.view(b, hk, hq // hk, -1)                                       # (b, hk, rep, D)
        if log_g is not None:
            decay = log_g[:, 0].to(cdt).exp()                                   # (b, hk)
            s.mul_(decay[..., None, None])
            z.mul_(decay[..., None])
        s.addcmul_(fk[..., :, None], v[:, 0].to(cdt)[..., None, :])          # + phi_w(k) v^T
        z.add_(fk)
        y = fq @ s                                                              # (b, hk, rep, d)
        if norm:
            den = (fq @ z[..., None]).clamp_min(0)                              # (b, hk, rep, 1)
            y = y / (den + EPS * den.clamp_min(math.exp(M_FLOOR)))
    return y.view(b, 1, hq, d).to(q.dtype)
