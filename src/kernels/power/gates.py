"""Cumulative log-gates G = cumsum(log_g) over time, per segment, with float64 accumulation, as one Triton pass.

Both forms need G (the attention form over the whole sequence, the chunked form chunk-locally). torch's
`log_g.double().cumsum(1).float()` on the (b, t, h) layout is a scan over an outer dimension with h = 12 columns:
on the H200 it took 0.75 ms at t=4k (b=8) and again in the backward, more than the attention forward kernel
itself (tools/profile_attn.py). Here a program scans one column (batch, head) of one segment, BT steps at a
time; the running sum is float64 (G's own rounding stays ~1e-7 |G|), the output is float32. The backward is the
reverse scan of dG within each segment.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import config


@triton.jit
def _segment_cumsum(X, X2, Y, T, SEG, H: tl.constexpr, BT: tl.constexpr, REVERSE: tl.constexpr, REP: tl.constexpr = 0):
    """Y[b, s, h] = sum of X[b, r, h] over r <= s (REVERSE: r >= s) within s's segment of SEG steps; X, Y (b, T, H).
    REP > 0: X2 (b, T, H * REP) joins X first, its REP consecutive columns summed into column h (the query heads
    of a GQA group: the attention backward's query-side gate gradients).
    One program per (segment, batch, column): BT steps of the column are one strided load and one float64 scan, so a
    segment of <= BT steps takes one step. (A program per (segment, batch) walked [1024 / h, h]
    tiles in series, 16 dependent steps on 8 programs at t = 1k, h = 12; this one took the H100's 1k fwd+bwd from
    0.388 to 0.350 ms, 4k from 3.04 to 2.93, and 64k's chunk-local scans are as fast. The h programs of a batch share
    the 32-byte sectors of their strided loads through L2.)"""
    seg = tl.program_id(0)
    i_b = (tl.program_id(1) // H).to(tl.int64)
    h = tl.program_id(1) % H
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, T)
    carry = tl.zeros([1], tl.float64)
    n_blocks = tl.cdiv(hi - lo, BT)
    for i in range(0, n_blocks):
        if REVERSE:
            start = hi - (i + 1) * BT
        else:
            start = lo + i * BT
        rows = start + tl.arange(0, BT)
        m = (rows >= lo) & (rows < hi)
        off = i_b * T * H + rows * H + h
        x = tl.load(X + off, mask=m, other=0.0).to(tl.float64)
        for r in tl.static_range(REP):
            x += tl.load(X2 + i_b * T * H * REP + rows * (H * REP) + h * REP + r, mask=m, other=0.0).to(tl.float64)
        inc = tl.cumsum(x, axis=0)
        tot = tl.sum(x, axis=0)
        if REVERSE:
            y = carry + (tot - inc + x)                                # inclusive suffix sums
        else:
            y = carry + inc
        carry += tot
        tl.store(Y + off, y.to(tl.float32), mask=m)




def segment_scan(x: torch.Tensor, seg: int, reverse: bool = False, extra: torch.Tensor | None = None,
                 record: dict | None = None) -> torch.Tensor:
    """The Triton scan, no autograd: float32 (b, t, h) cumsum (reverse: suffix sums) of x (b, t, h) within segments
    of seg steps; `extra` (b, t, h * rep) is added first with its rep consecutive columns summed per column of x.
    record: the compiled kernel goes in as "fwd_scan" / "bwd_scan" (native/launcher.py's plans; one segment per
    column)."""
    x = x.contiguous()
    b, t, h = x.shape
    rep = 0 if extra is None else extra.shape[-1] // h
    x2 = x if extra is None else extra.contiguous()
    y = torch.empty(b, t, h, device=x.device, dtype=torch.float32)
    kernel = _segment_cumsum[(-(-t // seg), b * h)](x, x2, y, t, seg, H=h, BT=config.gates.current().column_tile,
                                                    REVERSE=reverse, REP=rep, num_warps=4)
    if record is not None:
        record["bwd_scan" if reverse else "fwd_scan"] = (kernel, 0, h)
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
