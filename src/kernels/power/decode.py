"""One token of power attention against its recurrent state, updated in place: the decoding step.

`power_decode_step` is the public step: CUDA tensors take the fused Triton kernel (decode_kernel.py: state update,
query and normalizer in one launch), CPU tensors (and what the kernel does not take) `power_state_step`, plain torch
ops on the same preallocated buffers, the reference the kernel is checked against; both run inside a captured CUDA
graph or compiled. `symmetric_power_indices` gives the gather indices of the tiled symmetric power the kernels and
the reference use (reference.expand), so the state this step updates is the one the chunked kernels return after a
prompt.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from .decode_kernel import power_decode_step_kernel
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


def gate_log(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A per-head forget gate's log: logsigmoid(x w^T + bias) in fp32, x (b, t, dx), w (h, dx), bias (h,) ->
    (b, t, h) <= 0 (the models' HeadGate)."""
    with torch.autocast(x.device.type, enabled=False):
        return F.logsigmoid(F.linear(x.float(), w.float(), bias.float()))


@torch.library.custom_op("longctx::power_decode_step", mutates_args=("s", "z", "ticket"))
def _fused_step(s: torch.Tensor, z: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, ticket: torch.Tensor,
                q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: Optional[torch.Tensor],
                gate_x: Optional[torch.Tensor], gate_w: Optional[torch.Tensor], gate_b: Optional[torch.Tensor],
                p: int, norm: bool, scale: float) -> torch.Tensor:
    gate = (gate_x, gate_w, gate_b) if gate_x is not None else None
    if not s.is_cuda:  # the op on CPU tensors (opcheck, tests of the compiled graph): the reference
        log_g = gate_log(*gate) if gate is not None else log_g
        return power_state_step(s, z, index, weight, q, k, v, log_g, p, norm, scale)
    return power_decode_step_kernel(s, z, index, weight, ticket, q, k, v, log_g, p, norm, scale, gate=gate)


@_fused_step.register_fake
def _(s, z, index, weight, ticket, q, k, v, log_g, gate_x, gate_w, gate_b, p, norm, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def power_decode_step(s, z, index, weight, ticket, q, k, v, log_g, p: int, norm: bool, scale: float,
                      fused: bool = True, gate: Optional[tuple] = None):
    """One token against the state s (b, hk, D, d), z (b, hk, D), updated in place -> y (b, 1, hq, d) in q's dtype;
    the math of power_state_step. CUDA tensors with a contiguous fp32 state and a power-of-two head dim take the
    fused kernel (one launch; a custom op, so torch.compile keeps it whole), everything else power_state_step.
    index (p, D) int32 (symmetric_power_indices), weight (D,) in s's dtype, ticket (b*hk,) int32 zeros the kernel
    leaves zero; q (b, 1, hq, d), k, v (b, 1, hk, d), log_g (b, 1, hk) fp32 or None. gate: (x (b, 1, dx), w (hk, dx),
    bias (hk,)) in place of log_g, log_g = gate_log(x, w, bias), which the fused kernel computes itself (the gate's
    matmul and activation need no launches of their own). fused=False: the plain-torch step anyway.

    Example:
        >>> index, weight = symmetric_power_indices(2, 64, "cuda")
        >>> y = power_decode_step(s, z, index.int(), weight, ticket, q, k, v, log_g, p=2, norm=True, scale=0.125)"""
    if gate is not None and log_g is not None:
        raise ValueError("power_decode_step: give log_g or gate, not both")
    if fused and q.is_cuda and fused_kernel_takes(s, z, q):
        return _fused_step(s, z, index, weight, ticket, q, k, v, log_g, *(gate or (None, None, None)), p, norm,
                           scale)
    log_g = gate_log(*gate) if gate is not None else log_g
    return power_state_step(s, z, index, weight, q, k, v, log_g, p, norm, scale)


def fused_kernel_takes(s: torch.Tensor, z: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether the fused kernel runs this step: a contiguous fp32 state and a power-of-two head dim (on CUDA)."""
    d = q.shape[-1]
    return (s.dtype == z.dtype == torch.float32 and s.is_contiguous() and z.is_contiguous()
            and d >= 2 and d & (d - 1) == 0)
