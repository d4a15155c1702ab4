"""Host (CPU) cost per call of the pieces of a short power_attention call on a GPU: mean wall us over n calls
with one sync at the end, for pieces small enough that the host, not the GPU, sets the pace. Also a block
sweep of the attention form at --sweep-t (fwd, fwd+bwd medians).

    python3 scripts/gpu/host_overhead.py --t 1024 --sweep-t 1024
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_attention import inputs, run_once  # noqa: E402
from longctx.kernels import power_attention  # noqa: E402
from longctx.kernels.power import triton_attention as ta  # noqa: E402
from longctx.kernels.power.gates import gate_cumsum  # noqa: E402


def host_us(fn, n=200):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return round((t1 - t0) / n * 1e6, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--sweep-t", default="")
    ap.add_argument("--cprofile", action="store_true", help="also the top host functions of 100 fwd+bwd calls")
    args = ap.parse_args()
    (q, k, v), lg = inputs(8, args.t, 12, 64, True)
    qd, kd, vd, lgd = (x.detach() for x in (q, k, v, lg))
    G = gate_cumsum(lgd)
    o = torch.empty_like(qd)
    lse = torch.empty(qd.shape[:3], device="cuda")
    BM, BN, w, s, *_ = ta._blocks(64, "fwd", triton.language.bfloat16)

    def raw_launch():
        ta._attn_fwd[(triton.cdiv(args.t, BM), 96)](qd, kd, vd, G, o, lse, 0.125, 0.0156, args.t, HQ=12, HK=12, D=64,
                                                    P=2, NORM=True, GATED=True, BM=BM, BN=BN,
                                                    DOT_DT=triton.language.bfloat16, PREC="tf32", FAST=True,
                                                    num_warps=w, num_stages=s)

    def ours(q, k, v, lg):          # the public API itself (bench_attention.make_ours also sets an env variable)
        return power_attention(q, k, v, lg, p=2)

    def fwd_nograd():
        run_once(ours, qd, kd, vd, lgd, False)

    def fwd_bwd():
        run_once(ours, q, k, v, lg, True)

    def empty_like():
        torch.empty_like(qd)

    def ones_backward_only():
        y = (q * 1.0)
        y.backward(torch.ones_like(y))

    for name, fn in (("torch.empty_like", empty_like), ("gate_cumsum", lambda: gate_cumsum(lgd)),
                     ("_attn_fwd launch", raw_launch), ("power_attention fwd (no grad)", fwd_nograd),
                     ("fwd+bwd", fwd_bwd), ("mul + backward (autograd floor)", ones_backward_only)):
        print(json.dumps(dict(t=args.t, piece=name, host_us=host_us(fn))), flush=True)
    if args.cprofile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(100):
            fwd_bwd()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)
    for st in [int(x) for x in args.sweep_t.split(",") if x]:
        (q, k, v), lg = inputs(8, st, 12, 64, True)
        cfgs = [("fwd", c) for c in [(128, 64, 4, 4), (64, 64, 4, 4), (64, 32, 4, 4), (32, 32, 4, 3), (128, 32, 4, 4)]]
        cfgs += [("bwd", c) for c in [(64, 64, 4, 3), (32, 32, 4, 3), (64, 32, 4, 3), (32, 32, 4, 2), (128, 64, 8, 2)]]
        for rnd in range(3):                # rounds interleave the configs: short-t timings swing run to run
            for which, cfg in cfgs:
                ta.BLOCK_OVERRIDE.clear()
                ta.BLOCK_OVERRIDE[which] = cfg

                def fb():
                    run_once(ours, q, k, v, lg, True)
                fb()
                ms = do_bench(fb, warmup=10, rep=100, return_mode="median")
                print(json.dumps(dict(t=st, round=rnd, sweep=which, cfg=cfg, fwd_bwd=round(ms, 4))), flush=True)
        ta.BLOCK_OVERRIDE.clear()


if __name__ == "__main__":
    main()
