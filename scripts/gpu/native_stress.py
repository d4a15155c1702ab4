"""Stress the attention form's C++ node against its Python node: many fresh draws per case, every output and
gradient compared bit for bit; a mismatch prints which tensor, how many elements, where (row, head) and the values.

    python3 scripts/gpu/native_stress.py --iters 100
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "kernels"))
from longctx.kernels.power import native  # noqa: E402
from longctx.kernels.power.triton_attention import attention_form  # noqa: E402

CASES = [  # p, norm, d, dtype, gated, hq, hk, t
    (2, True, 64, torch.bfloat16, False, 4, 2, 1000), (2, True, 64, torch.bfloat16, True, 12, 12, 1024),
    (4, True, 64, torch.bfloat16, True, 6, 3, 77), (1, False, 32, torch.float16, True, 4, 4, 333)]


def run(case, seed, use_native):
    p, norm, d, dtype, gated, hq, hk, t = case
    os.environ[native.ENV] = "1" if use_native else "0"
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, t, hq, d, device="cuda", generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, t, hk, d, device="cuda", generator=g).to(dtype).requires_grad_()
    v = torch.randn(2, t, hk, d, device="cuda", generator=g).to(dtype).requires_grad_()
    lg = (-0.5 * torch.rand(2, t, hk, device="cuda", generator=g)).requires_grad_() if gated else None
    do = torch.randn(2, t, hq, d, device="cuda", generator=g).to(dtype)
    leaves = [x for x in (q, k, v, lg) if x is not None]
    with torch.no_grad():
        y_ng = attention_form(q, k, v, lg, p=p, scale=d ** -0.5, norm=norm)
    y = attention_form(q, k, v, lg, p=p, scale=d ** -0.5, norm=norm)
    grads = torch.autograd.grad(y, leaves, do)
    torch.cuda.synchronize()
    return [y_ng, y, *grads]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()
    assert native.wait(), native.status()
    names = ["y (no grad)", "y", "dq", "dk", "dv", "dlog_g"]
    for case in CASES:
        run(case, 0, True)
        run(case, 0, True)                     # plans recorded
        bad = 0
        for it in range(args.iters):
            a, b = run(case, it, False), run(case, it, True)
            for name, x, y in zip(names, a, b):
                if not torch.equal(x, y):
                    bad += 1
                    diff = (x.float() - y.float()).abs()
                    idx = (diff > 0) | (x.isnan() != y.isnan())
                    where = idx.nonzero()
                    print(f"MISMATCH case={case} iter={it} {name}: {int(idx.sum())} elements, max |diff| "
                          f"{diff.nan_to_num(nan=float('inf')).max().item():.3e}, first at {where[:3].tolist()}, "
                          f"rows {where[:, 1].min().item()}..{where[:, 1].max().item()}; python "
                          f"{x[tuple(where[0])].item()} native {y[tuple(where[0])].item()}", flush=True)
        print(f"case={case}: {bad} mismatches in {args.iters} draws", flush=True)


if __name__ == "__main__":
    main()
