"""Would FlexAttention run the chunked form's intra-chunk attention faster than our Triton kernels?

The intra-chunk part of normalized power attention (even p) is a softmax attention in log space: within a chunk,
weights (s q_i.k_j)^p e^(G_i - G_j) = exp(p log|s q_i.k_j| + G_i - G_j), G the chunk-local gate cumsum, so FlexAttention
with that score_mod and a block-diagonal causal mask computes the same y_intra and its log-normalizer. At 64k the intra
part costs 14.2 ms of the 60 ms fwd+bwd (session 17: forward 3.8, dq 4.3, dk/dv 6.0, ~200-220 TFLOP/s), so a kernel
at cuDNN's ~450 TFLOP/s would take ~7 ms off. This measures, in one process on one card: our attention form on the
chunks as batch entries (what the chunked form launches, with the combined normalizer there) against compiled
flex_attention, forward and forward + backward (q, k, v gradients; the gates need none in the Flex run: their
gradient would need grads of a captured tensor), after an output check at a short length.
  source scripts/gpu/setup_device.sh; python3 scripts/gpu/flex_intra.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

from longctx.kernels.power.triton_attention import attention_form


def make(b, t, h, d, grad):
    torch.manual_seed(0)
    q, k, v = ((torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16) / math.sqrt(d)).requires_grad_(grad)
               for _ in range(3))
    lg = F.logsigmoid(torch.randn(b, t, h, device="cuda") + 6.9)
    return q, k, v, lg


def ours(q, k, v, lg, chunk, p, scale):
    """The chunked form's intra-chunk attention: the attention form with every chunk a batch entry."""
    b, t, h, d = q.shape
    nb = b * t // chunk
    y = attention_form(q.view(nb, chunk, h, d), k.view(nb, chunk, h, d), v.view(nb, chunk, h, d),
                       lg.view(nb, chunk, h), p=p, scale=scale, norm=True)
    return y.view(b, t, h, d)


def flex_call(t, chunk, p, lg):
    """(call(q, k, v) on (b, t, h, d) tensors, block mask build seconds): compiled flex_attention with the power score_mod
    and the block-diagonal causal mask."""
    b, _, h = lg.shape
    G = lg.view(b, t // chunk, chunk, h).cumsum(2).view(b, t, h).transpose(1, 2).contiguous()   # (b, h, t)

    def score_mod(score, bi, hi, qi, ki):
        return p * torch.log(torch.abs(score)) + G[bi, hi, qi] - G[bi, hi, ki]

    def mask_mod(bi, hi, qi, ki):
        return (qi // chunk == ki // chunk) & (qi >= ki)

    t0 = time.time()
    # _compile: the mask built block by block (evaluated densely at 64k its int64 index grids would need ~34 GB)
    mask = create_block_mask(mask_mod, None, None, t, t, device="cuda", _compile=True)
    built = time.time() - t0
    compiled = torch.compile(flex_attention)

    def call(q, k, v, scale):
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod, block_mask=mask,
                       scale=scale)
        return out.transpose(1, 2)
    return call, built


def timed(fn, backward, q, k, v):
    def run():
        if backward:
            y = fn()
            y.backward(torch.ones_like(y))
        else:
            with torch.no_grad():
                fn()
    t0 = time.time()
    run()
    torch.cuda.synchronize()
    first = time.time() - t0
    for x in (q, k, v):
        x.grad = None
    return do_bench(run, warmup=5, rep=30, return_mode="median", grad_to_none=[q, k, v]), first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/flex_intra"))
    ap.add_argument("--t", type=int, default=65536)
    ap.add_argument("--check-t", type=int, default=8192)
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--h", type=int, default=12)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--p", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    scale = args.d ** -0.5
    rows = []
    # the check: both outputs against each other at a short length (same gates, same inputs)
    q, k, v, lg = make(args.b, args.check_t, args.h, args.d, False)
    call, _ = flex_call(args.check_t, args.chunk, args.p, lg)
    with torch.no_grad():
        a, f = ours(q, k, v, lg, args.chunk, args.p, scale).float(), call(q, k, v, scale).float()
    err = ((a - f).norm() / a.norm()).item()
    print(f"CHECK t={args.check_t}: rel err ours vs flex {err:.2e}", flush=True)
    rows.append({"check_t": args.check_t, "rel_err": err})
    del q, k, v, lg, a, f, call
    q, k, v, lg = make(args.b, args.t, args.h, args.d, True)
    call, built = flex_call(args.t, args.chunk, args.p, lg)
    for name, fn in (("ours", lambda: ours(q, k, v, lg, args.chunk, args.p, scale)),
                     ("flex", lambda: call(q, k, v, scale))):
        for backward in (False, True):
            torch.cuda.reset_peak_memory_stats()
            ms, first = timed(fn, backward, q, k, v)
            row = {"impl": name, "mode": "fwdbwd" if backward else "fwd", "t": args.t, "chunk": args.chunk,
                   "ms": round(ms, 3), "first_call_s": round(first, 1),
                   "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2), "gpu": torch.cuda.get_device_name()}
            if name == "flex":
                row["block_mask_s"] = round(built, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(os.path.join(args.out, "flex_intra.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
