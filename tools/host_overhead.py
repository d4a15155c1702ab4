"""Host (CPU) cost per call of the pieces of a short power_attention call on a GPU: mean wall us over n calls
with one sync at the end, for pieces small enough that the host, not the GPU, sets the pace. Also a block
sweep of the attention form at --sweep-t (fwd, fwd+bwd medians). The pieces separate the kernels' own launches
(raw passes, main thread) from the autograd node around them (an empty node over the same four leaves, the raw
backward inside a node: the engine runs it on its device thread) and from cuDNN's fwd+bwd in the same process.
Host times of one piece swing by 30% run to run on a shared GPU host: compare pieces of one run.

    python -m tools.host_overhead --t 1024 --sweep-t 1024
    python -m tools.host_overhead --t 1024 --kernels --cpu-ops     # + per-kernel GPU time, CPU op tables
"""
import argparse
import json
import time

import torch
import triton
from triton.testing import do_bench

from longctx.kernels.bench import inputs, make_ours, make_sdpa, profile, run_once
from tools.host_overhead_cpu import EmptyNode
from longctx.kernels import power_attention
from longctx.kernels.power import autograd, config, kernel_index
from longctx.kernels.power import parallel as ta
from longctx.kernels.power import gates
from longctx.kernels.power.gates import gate_cumsum


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
    ap.add_argument("--cpu-ops", action="store_true",
                    help="also the torch profiler's CPU ops / runtime calls of 20 fwd+bwd calls, ours and cuDNN")
    ap.add_argument("--kernels", action="store_true",
                    help="also the per-kernel GPU time of one fwd+bwd, ours and SDPA cuDNN (PROFILE tables)")
    ap.add_argument("--no-gc", action="store_true", help="Python's garbage collector off while timing")
    args = ap.parse_args()
    if args.no_gc:
        import gc
        gc.disable()
    (q, k, v), lg = inputs(8, args.t, 12, 64, True)
    qd, kd, vd, lgd = (x.detach() for x in (q, k, v, lg))
    G = gate_cumsum(lgd)
    o = torch.empty_like(qd)
    lse = torch.empty(qd.shape[:3], device="cuda")
    BM, BN, w, s, *_ = ta.blocks(64, "fwd", triton.language.bfloat16)
    attn_fwd = kernel_index.jit("attn_fwd")

    def raw_launch():
        attn_fwd[(triton.cdiv(args.t, BM), 96)](qd, kd, vd, G, o, lse, 0.125, 0.0156, args.t, HQ=12, HK=12, D=64,
                                                P=2, NORM=True, GATED=True, BM=BM, BN=BN,
                                                DOT_DT=triton.language.bfloat16, PREC="tf32", FAST=True,
                                                num_warps=w, num_stages=s)

    def ours(q, k, v, lg):          # the public API itself (kernels.bench.make_ours also sets an env variable)
        return power_attention(q, k, v, lg, p=2)

    def fwd_nograd():
        run_once(ours, qd, kd, vd, lgd, False)

    def fwd_bwd():
        run_once(ours, q, k, v, lg, True)

    cudnn = make_sdpa("cudnn")
    from longctx.kernels.power.interface import check_inputs
    from longctx.kernels.power.plan import make_plan
    scale = 64 ** -0.5
    plan = make_plan(args.t, 2, 64, q.dtype, "cuda", form="attention")
    o_, lse_, G_ = ta.attention_forward(qd, kd, vd, lgd, scale, 2, True)
    do_ = torch.ones_like(o_)

    def attn_fwd_raw():          # the forward's launches and buffers, no autograd, no dispatch
        ta.attention_forward(qd, kd, vd, lgd, scale, 2, True)

    def attn_bwd_raw():
        ta.attention_backward(do_, qd, kd, vd, G_, o_, lse_, scale, 2, True, True)

    def form_apply():            # the autograd node's forward (graph recorded, no backward)
        autograd.python_node(plan, q, k, v, lg, scale)

    extra_ = lgd.clone()

    def form_fwd_bwd():          # the autograd node directly (no checks, no dispatch)
        y = autograd.python_node(plan, q, k, v, lg, scale)
        y.backward(torch.ones_like(y))

    def empty_fwd_bwd():          # the floor of a Python autograd node over the same four leaves
        y = EmptyNode.apply(q, k, v, lg)
        y.backward(torch.ones_like(y))

    class RawInside(torch.autograd.Function):  # the raw backward's launches inside an autograd node's backward
        @staticmethod
        def forward(ctx, q, k, v, lg):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            return ta.attention_backward(do_, qd, kd, vd, G_, o_, lse_, scale, 2, True, True)

    def raw_inside_fwd_bwd():
        y = RawInside.apply(q, k, v, lg)
        y.backward(torch.ones_like(y))

    def raw_fwd_then_bwd():      # both raw passes back to back on the main thread, no autograd
        attn_fwd_raw()
        attn_bwd_raw()

    def scan_rev():
        gates.segment_scan(lgd, args.t, reverse=True, extra=extra_)

    def cudnn_fwd_bwd():
        run_once(cudnn, q, k, v, lg, True)

    def empty_like():
        torch.empty_like(qd)

    def ones_backward_only():
        y = (q * 1.0)
        y.backward(torch.ones_like(y))

    for name, fn in (("torch.empty_like", empty_like), ("gate_cumsum", lambda: gate_cumsum(lgd)),
                     ("segment_scan fwd", lambda: gates.segment_scan(lgd, args.t)),
                     ("segment_scan reverse + extra", scan_rev),
                     ("check_inputs", lambda: check_inputs(q, k, v, lg, 2, None, None, True, None)),
                     ("attention_forward raw", attn_fwd_raw), ("attention_backward raw", attn_bwd_raw),
                     ("python_node (grad, no backward)", form_apply),
                     ("_attn_fwd launch", raw_launch), ("power_attention fwd (no grad)", fwd_nograd),
                     ("fwd+bwd", fwd_bwd), ("python_node fwd+bwd", form_fwd_bwd),
                     ("empty autograd node fwd+bwd (4 leaves)", empty_fwd_bwd),
                     ("raw backward inside an autograd node", raw_inside_fwd_bwd),
                     ("raw fwd + raw bwd, main thread", raw_fwd_then_bwd), ("SDPA cuDNN fwd+bwd", cudnn_fwd_bwd),
                     ("mul + backward (autograd floor)", ones_backward_only),
                     ("fwd+bwd again (the same call: the host's run-to-run noise)", fwd_bwd)):
        print(json.dumps(dict(t=args.t, piece=name, host_us=host_us(fn))), flush=True)
    if args.cpu_ops:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprofile
        for name, fn in (("longctx_p2", fwd_bwd), ("sdpa_cudnn", cudnn_fwd_bwd)):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with tprofile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            print(f"CPU OPS {name} (20 fwd+bwd calls)", flush=True)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    if args.kernels:
        profile("longctx_p2", make_ours(2), 8, args.t, 12, 64)
        profile("sdpa_cudnn", cudnn, 8, args.t, 12, 64)
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
                with config.attention.override(block_override={which: cfg}):
                    def fb():
                        run_once(ours, q, k, v, lg, True)
                    fb()
                    ms = do_bench(fb, warmup=10, rep=100, return_mode="median")
                print(json.dumps(dict(t=st, round=rnd, sweep=which, cfg=cfg, fwd_bwd=round(ms, 4))), flush=True)


if __name__ == "__main__":
    main()
