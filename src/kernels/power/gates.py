"""Cumulative log-gates G = cumsum(log_g) over time, per segment, with float64 accumulation, as one Triton pass.

Both forms need G (the attention form over the whole sequence, the chunked form chunk-locally). torch's
`log_g.double().cumsum(1).float()` on the (b, t, h) layout is a scan over an outer dimension with h = 12 columns:
on the H200 it took 0.75 ms at t=4k (b=8) and again in the backward, more than the attention forward kernel
itself (scripts/gpu/profile_attn.py). Here a program scans one (batch, segment) tile by tile: [BT, H] tiles are
contiguous rows, the running sum is float64 (G's own rounding stays ~1e-7 |G|), the output is float32. The
backward is the reverse scan of dG within each segment.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _segment_cumsum(X, X2, Y, T, SEG, H: tl.constexpr, HP: tl.constexpr, BT: tl.constexpr, REVERSE: tl.constexpr,
                    REP: tl.constexpr = 0):
    """Y[b, s] = sum of X[b, r] over r <= s (REVERSE: r >= s) within s's segment of SEG steps; X, Y (b, T, H).
    REP > 0: X2 (b, T, H * REP) joins X first, its REP consecutive columns summed into column h (the query heads
    of a GQA group: the attention backward's query-side gate gradients)."""
    seg = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, T)
    cols = tl.arange(0, HP)
    carry = tl.zeros([HP], tl.float64)
    n_blocks = tl.cdiv(hi - lo, BT)
    for i in range(0, n_blocks):
        if REVERSE:
            start = hi - (i + 1) * BT
        else:
            start = lo + i * BT
        rows = start + tl.arange(0, BT)
        m = ((rows >= lo) & (rows < hi))[:, None] & (cols < H)[None, :]
        off = i_b * T * H + rows[:, None] * H + cols[None, :]
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float64)
        for r in tl.static_range(REP):
            off2 = i_b * T * H * REP + rows[:, None] * (H * REP) + cols[None, :] * REP + r
            x += tl.load(X2 + off2, mask=m, other=0.0).to(tl.float64)
        inc = tl.cumsum(x, axis=0)
        tot = tl.sum(x, axis=0)
        if REVERSE:
            y = carry[None, :] + (tot[None, :] - inc + x)        # inclusive suffix sums
        else:
            y = carry[None, :] + inc
        carry += tot
        tl.store(Y + off, y.to(tl.float32), mask=m)


def _pow2(n: int) -> int:
    """Next power of two (plain Python: triton.next_power_of_2 is a constexpr function with a costly call path)."""
    return 1 << max(0, n - 1).bit_length()


def tile_rows(h: int) -> int:
    """Time steps per tile: float64 tiles of ~1024 values (8 per thread at 4 warps: no spills on sm_90)."""
    return max(16, min(128, 1024 // _pow2(h)))


def segment_scan(x: torch.Tensor, seg: int, reverse: bool = False, extra: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton scan, no autograd: float32 (b, t, h) cumsum (reverse: suffix sums) of x (b, t, h) within segments
    of seg steps; `extra` (b, t, h * rep) is added first with its rep consecutive columns summed per column of x."""
    x = x.contiguous()
    b, t, h = x.shape
    rep = 0 if extra is None else extra.shape[-1] // h
    x2 = x if extra is None else extra.contiguous()
    y = torch.empty(b, t, h, device=x.device, dtype=torch.float32)
    _segment_cumsum[(-(-t // seg), b)](x, x2, y, t, seg, H=h, HP=_pow2(h), BT=tile_rows(h), REVERSE=reverse, REP=rep,
                                       num_warps=4)
    return y


class _SegmentCumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, log_g, seg):
        ctx.seg = seg
        return segment_scan(log_g, seg)

    @staticmethod
    def backward(ctx, dG):
        return segment_scan(dG, ctx.seg, reverse=True), None


def gate_cumsum(log_g: torch.Tensor, seg: int | None = None) -> torch.Tensor:
    """G (b, t, h) float32 = cumsum of log_g (b, t, h) over time within segments of `seg` steps (None: one
    segment), accumulated in float64. Differentiable. Triton only (CUDA, or CPU under TRITON_INTERPRET=1), like
    the kernels that read G; power_attention's CPU path is the reference, which sums its own gates."""
    return _SegmentCumsum.apply(log_g, log_g.shape[1] if seg is None else int(seg))
