"""Developer tool: time the attention-form kernels over block configurations on a GPU.

    python -m tools.tune --t 4096,16384 --d 64 [--which fwd,dkdv,dq]
Prints median ms of the forward, or of the backward, for each (BM, BN, warps, stages) of the kernel named by
--which ("fwd", "dkdv" or "dq" alone, the others keeping their defaults; "bwd" sets both backward kernels).
"""
import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from longctx.kernels.power import config
from longctx.kernels.power.autograd import attention_form


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", default="4096")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--which", default="fwd,dkdv,dq")
    ap.add_argument("--gated", type=int, default=1)
    args = ap.parse_args()
    b, h, d = 8, 12, args.d
    fwd_cfgs = [c for c in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)) if not (c[0] == 64 and c[2] == 8)]
    bwd_cfgs = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)))
    for t in map(int, args.t.split(",")):
        q, k, v = (torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        lg = F.logsigmoid(torch.randn(b, t, h, device="cuda") + 6.9).requires_grad_() if args.gated else None
        flops = 2 * b * h * t * t * d
        for which in args.which.split(","):
            res = []
            for cfg in (fwd_cfgs if which == "fwd" else bwd_cfgs):
                with config.attention.override(block_override={which: cfg}):
                    try:
                        if which == "fwd":
                            with torch.no_grad():
                                fn = lambda: attention_form(q, k, v, lg, p=args.p, scale=d ** -0.5,  # noqa: E731
                                                            norm=args.p % 2 == 0)
                                fn()
                                ms = do_bench(fn, warmup=3, rep=30, return_mode="median")
                        else:
                            y = attention_form(q, k, v, lg, p=args.p, scale=d ** -0.5, norm=args.p % 2 == 0)
                            do = torch.randn_like(y)
                            fn = lambda: torch.autograd.grad(y, [q, k, v], do, retain_graph=True)
                            fn()
                            ms = do_bench(fn, warmup=3, rep=30, return_mode="median")
                    except Exception:  # noqa: BLE001 (a tile that does not fit)
                        ms = float("nan")
                tf = flops * (1 if which == "fwd" else 2.5) / ms / 1e9
                res.append((ms, cfg))
                print(json.dumps(dict(t=t, d=d, which=which, cfg=cfg, ms=round(ms, 3), tflops=round(tf, 1))), flush=True)
            res = sorted(r for r in res if r[0] == r[0])
            print("BEST", t, d, which, res[:3], flush=True)


if __name__ == "__main__":
    main()
